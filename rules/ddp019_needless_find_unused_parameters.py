"""DDP019: `find_unused_parameters=True` for a model whose forward uses every parameter."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.wrappers import model_origins, wrap_calls, wrapped_module
from ddpify.anatomy import syntax
from ddpify.anatomy.unused_parameters import BRANCHES, calls_submodules_on_some_paths, is_self_attribute, methods_reached
from ddpify.anatomy.vocabulary import MODEL_CONTAINERS, is_builtin_layer
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._ddp import remove_keyword_fix

class NeedlessFindUnusedParameters(Rule, code="DDP019", name="needless-find-unused-parameters", severity="info"):
    """## What it does
    Flags `DDP(model, find_unused_parameters=True)` when the whole model is in sight and every
    parameter takes part in every forward: a built-in `torch.nn` layer (`nn.Linear`,
    `nn.Sequential`, ...), or a model class of this file whose `forward` (with the methods it
    calls) uses every submodule it creates, has no branches (`if`, `try`, `while`, early exits)
    and returns a single tensor (a tuple or dict of outputs may feed only part of them into the
    loss). Models built elsewhere are never reported.

    ## Why is this bad?
    With the flag set, DDP walks the autograd graph after every forward to find parameters that
    will get no gradient, and marks them ready by hand: extra work on every iteration (DDP itself
    logs a warning when it finds none). It also disables some bucketing optimisations.

    The rule is enabled by default and reports at info level: it only fires when the model is
    fully visible, so it is rarely wrong, but the cost is performance, not correctness.

    ## Example
    ```python
    model = DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU()).cuda(), device_ids=[rank], find_unused_parameters=True)
    ```

    ## Use instead
    ```python
    model = DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU()).cuda(), device_ids=[rank])
    ```

    ## Fix safety
    Unsafe: removes the keyword. If a parameter does go unused after all (a branch the rule
    cannot see, a frozen head whose output is dropped), DDP then raises at the next iteration
    ("Expected to have finished reduction in the prior iteration").
    """

    message = "`find_unused_parameters=True` but every parameter is used in forward: it only costs time"

    def check(self, a):
        for site in wrap_calls(a):
            call: ast.Call = site.node  # type: ignore[assignment]
            flag = syntax.keyword(call, "find_unused_parameters")
            inner = wrapped_module(call)
            if flag is None or not syntax.constant(flag.value, True) or inner is None:
                continue
            origins = model_origins(a, inner)
            if origins and all(_uses_every_parameter(a, o) for o in origins):
                fix = remove_keyword_fix(a, call, flag, safe=False, description="drop find_unused_parameters=True")
                yield Finding(a.pos(flag), fix=fix)


def _uses_every_parameter(a, constructor: ast.Call) -> bool:
    q = a.qualname(constructor.func) or ""
    mc = a.model_classes.get(q)
    if mc is None:
        return is_builtin_layer(q) and q not in MODEL_CONTAINERS
    forward = mc.forward
    if forward is None:
        return False
    methods = methods_reached(mc)
    if any(isinstance(n, BRANCHES) for m in methods for n in ast.walk(m)) or calls_submodules_on_some_paths(a, mc) or _early_return(methods):
        return False
    if not _single_tensor_return(forward) or any(a.qualname(b) in a.model_classes for b in mc.node.bases):
        return False  # several outputs, or submodules inherited from a class not read here
    used = {n.attr for m in methods for n in ast.walk(m) if is_self_attribute(n) and isinstance(n.ctx, ast.Load)}
    return _submodules(a, mc.node) <= used


def _early_return(methods: list[ast.FunctionDef]) -> bool:
    return any(isinstance(n, ast.Return) and n is not m.body[-1] for m in methods for n in ast.walk(m))


def _single_tensor_return(fn: ast.FunctionDef) -> bool:
    last = fn.body[-1]
    return isinstance(last, ast.Return) and last.value is not None and not isinstance(last.value, (ast.Tuple, ast.Dict, ast.List))


def _submodules(a, cls: ast.ClassDef) -> set[str]:
    """`self.x = <module constructor>(...)` anywhere in the class."""
    found = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and a.is_model_constructor(a.qualname(node.value.func) or ""):
            found |= {t.attr for t in node.targets if is_self_attribute(t)}
    return found


_HEAD = """import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.cls_head = nn.Linear(4, 2)
        self.aux_head = nn.Linear(4, 1)

    def forward(self, x, with_aux=False):
        h = self.body(x)
        if with_aux:
            return self.cls_head(h), self.aux_head(h)
        return self.cls_head(h)


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


dist.init_process_group("gloo")
"""

NeedlessFindUnusedParameters.VALID = (
    _HEAD + "model = DDP(TwoHeads(), find_unused_parameters=True)\n",
    _HEAD + "model = DDP(Plain())\n",
    _HEAD.replace("return self.fc2(", "for _ in range(int(torch.randint(0, 3, (1,)))):\n            x = self.fc1(x)\n        return self.fc2(")
    + "model = DDP(Plain(), find_unused_parameters=True)\n",  # fc1 runs a random number of times, none included
    "import torch.distributed as dist\nimport torchvision\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    "dist.init_process_group('gloo')\nmodel = DDP(torchvision.models.resnet18(), find_unused_parameters=True)\n",
)
NeedlessFindUnusedParameters.INVALID = (
    Invalid.fixed_by(_HEAD + "model = DDP(Plain(), find_unused_parameters=True)\n", old=", find_unused_parameters=True", new=""),
    Invalid.fixed_by(
        _HEAD + "model = DDP(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), broadcast_buffers=False, find_unused_parameters=True)\n",
        old=", find_unused_parameters=True", new="",
    ),
)
