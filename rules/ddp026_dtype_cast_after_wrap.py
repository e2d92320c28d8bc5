"""DDP026: the wrapped model's parameters cast to another dtype after the DDP wrap, before it trains."""

from __future__ import annotations

import ast

from ddpify.anatomy import ROLE_MODEL
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import NET
from ddpify.rules._ddp import is_ddp_wrapper, wraps_models


class DtypeCastAfterWrap(Rule, code="DDP026", name="dtype-cast-after-wrap", severity="error"):
    """## What it does
    Flags a cast of a DDP-wrapped model to another dtype — `model.double()`, `model.module.half()`,
    `model.float()`, `model.bfloat16()`, `model.type(torch.float64)`, `model.to(torch.float64)`,
    `model.to(device, dtype=...)` — made on the wrapper or on the model inside it (`.module`) when
    training follows: a backward or an optimizer step later in its function, or in a loop around it
    that trains. A cast once training is over (to save a half-precision copy) is not reported.

    ## Why is this bad?
    `DistributedDataParallel` builds its gradient buckets, the flat buffers it all-reduces, in the
    dtype the parameters have when it wraps them. Cast afterwards, the parameters train in the new
    dtype while their gradients are still copied into the old buckets and averaged there: float64
    gradients go through float32 (a relative error of about 1e-7 each step), and nothing raises an
    error. The PyTorch docs: the parameters must not change after the wrap.

    ## Example
    ```python
    model = Net().to(device)
    model = DDP(model, device_ids=[rank])
    model.module.double()
    ```

    ## Use instead
    ```python
    model = Net().to(device)
    model.double()
    model = DDP(model, device_ids=[rank])
    ```

    ## Fix safety
    No fix: the cast must move above the wrap, which may move code that other statements depend on.
    """

    message = "model cast to another dtype after the DDP wrap: its gradients are still all-reduced in the dtype the wrapper was built for"

    def check(self, a):
        if not wraps_models(a):
            return
        for node in a.nodes_of(ast.Call):
            if a.is_dtype_cast(node) and _casts_a_wrapped_model(a, node.func.value) and a.trains_after(a.stmt_of[node]):
                yield Finding(a.pos(node))


def _casts_a_wrapped_model(a, receiver: ast.AST) -> bool:
    """Is `receiver` a DDP wrapper, or the model inside one (`model.module`)?"""
    if isinstance(receiver, ast.Attribute) and receiver.attr == "module":
        receiver = receiver.value
    return isinstance(receiver, (ast.Name, ast.Attribute)) and a.has_role(receiver, ROLE_MODEL) and is_ddp_wrapper(a, receiver)


_HEAD = """import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


""" + NET + """

dist.init_process_group("gloo")
"""
_STEP = "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(torch.ones(2, 4)).sum().backward()\noptimizer.step()\n"

DtypeCastAfterWrap.VALID = (
    # cast before the wrap: the buckets are built for float64
    _HEAD + "model = Net()\nmodel.double()\nmodel = DDP(model)\n" + _STEP,
    # cast once training is over, to save a half-precision copy
    _HEAD + "model = DDP(Net())\n" + _STEP + "model.module.half()\ntorch.save(model.module.state_dict(), 'net.pt')\n",
    # a tensor cast, not the model's
    _HEAD + "model = DDP(Net())\nx = torch.ones(2, 4).double()\n" + _STEP,
    # a move to the device is no cast
    _HEAD + "model = DDP(Net())\nmodel.to('cpu')\n" + _STEP,
)
DtypeCastAfterWrap.INVALID = (
    Invalid(_HEAD + "model = DDP(Net())\nmodel.module.double()\n" + _STEP, line=21),
    Invalid(_HEAD + "model = DDP(Net())\nmodel.to(torch.float64)\n" + _STEP, line=21),
    Invalid(_HEAD + "model = DDP(Net())\nfor epoch in range(2):\n    model.half()\n"
            "    model(torch.ones(2, 4)).sum().backward()\n", line=22),
)
