"""DDP018: an optimizer that updates a model other than the one DDP wraps."""

from __future__ import annotations

import ast

from ddpify.anatomy import ROLE_MODEL
from ddpify.anatomy.distributed.wrappers import model_origins, wrapped_origins
from ddpify.anatomy import syntax
from ddpify.anatomy.vocabulary import is_optimizer_constructor
from ddpify.lint import Finding, Invalid, Rule


class OptimizerNotOnWrappedModel(Rule, code="DDP018", name="optimizer-not-on-wrapped-model", severity="error"):
    """## What it does
    Flags an optimizer built from the parameters of a model object that no
    `DistributedDataParallel(...)` call wraps: a model constructed again after wrapping
    (`model = Net()` to load a checkpoint, then `SGD(model.parameters())`), a model built inline
    (`SGD(Net().parameters())`), or a second network that was never wrapped. Model objects are
    told apart by their constructor call, followed through variables, `.to()` chains, `.module`
    and function arguments.

    ## Why is this bad?
    DDP averages the gradients of the parameters it wraps. An optimizer holding other parameter
    objects either steps a model that the forward pass never uses (the wrapped model silently
    never learns), or steps a model whose gradients are never averaged, so every rank trains its
    own copy and the replicas drift apart. Neither raises an error.

    ## Example
    ```python
    model = DDP(Net().to(rank), device_ids=[rank])
    net = Net().to(rank)
    net.load_state_dict(state)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    ```

    ## Use instead
    ```python
    net = Net().to(rank)
    net.load_state_dict(state)
    model = DDP(net, device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ```

    ## Fix safety
    No fix: which of the two models was meant is a decision for the author.
    """

    message = "optimizer updates a model that DDP does not wrap: its gradients are never averaged across ranks"

    def check(self, a):
        wrapped = wrapped_origins(a)
        if not wrapped:
            return
        for site in a.calls:
            if not is_optimizer_constructor(site.qualname):
                continue
            params = syntax.argument(site.node, 0, "params")  # type: ignore[arg-type]
            for origins in _models_read(a, params) if params is not None else ():
                if not origins & wrapped:
                    yield Finding(site.pos)
                    break


def _models_read(a, params: ast.AST) -> list[set[ast.Call]]:
    """The constructor calls of each model whose parameters `params` reads (traceable ones only)."""
    found = []
    for node in ast.walk(params):
        if isinstance(node, ast.Call) and a.is_model_constructor(a.qualname(node.func) or ""):
            found.append({node})
        elif isinstance(node, (ast.Name, ast.Attribute)) and a.ref(node) is not None and a.has_role(node, ROLE_MODEL):
            origins = model_origins(a, node)
            if origins:
                found.append(origins)
    return found


_HEAD = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
"""

OptimizerNotOnWrappedModel.VALID = (
    _HEAD + "model = torch.nn.Linear(4, 1)\nddp_model = DDP(model)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    _HEAD + "model = DDP(torch.nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    _HEAD + "net = torch.nn.Linear(4, 1)\nopt = torch.optim.Adam(net.parameters())\nnet = DDP(net)\n",
    _HEAD + """

class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(4, 1)
        self.model = DDP(self.model)
        self.opt = torch.optim.SGD(self.model.module.parameters(), lr=0.1)
""",
)
OptimizerNotOnWrappedModel.INVALID = (
    Invalid(
        _HEAD + "net = torch.nn.Linear(4, 1)\nmodel = DDP(net)\nnet = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n",
        line=9,
    ),
    Invalid(_HEAD + "model = DDP(torch.nn.Linear(4, 1))\nopt = torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1)\n", line=7),
)
