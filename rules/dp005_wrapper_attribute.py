"""DP005: the model's own attributes read through the DataParallel wrapper."""

from __future__ import annotations

import ast

from ddpify.lint import Finding, Invalid, Rule
from ddpify.anatomy.vocabulary import DP_WRAPPER, wrapper_lacks
from ddpify.rules._ddp import module_fix
from ddpify.rules._dp import is_dp_wrapper


class WrapperAttribute(Rule, code="DP005", name="dp-wrapper-attribute", severity="error"):
    """## What it does
    Flags `model.<name>` where `model` is the `nn.DataParallel` wrapper and `<name>` is neither
    something every `nn.Module` has nor DataParallel's own (`module`, `device_ids`, ...): the
    model's own methods (`model.generate()`), submodules (`model.fc`) and attributes (`model.vocab`).

    ## Why is this bad?
    DataParallel keeps the network as `self.module` and does not forward attribute lookups to it:
    `model.generate` raises `AttributeError: 'DataParallel' object has no attribute 'generate'`,
    typically at evaluation time, after training finished.

    ## Example
    ```python
    model = nn.DataParallel(TinyLM(vocab))
    print(model.vocab)
    ```

    ## Use instead
    ```python
    print(model.module.vocab)
    ```

    ## Fix safety
    Inserting `.module` is safe: the line raised `AttributeError` before.
    """

    message = "attribute of the model read through the DataParallel wrapper; use `.module`"

    def check(self, a):
        for node in a.nodes:
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
                continue
            if not wrapper_lacks(DP_WRAPPER, node.attr) or not is_dp_wrapper(a, node.value):
                continue
            fix = module_fix(a, node.value, safe=True, description=f"read `{node.attr}` from `.module`")
            yield Finding(a.pos(node), f"DataParallel has no attribute `{node.attr}` (AttributeError); use `.module.{node.attr}`", fix)


_HEAD = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.labels = ["a", "b"]

    def forward(self, x):
        return self.fc(x)


model = Net()
"""

WrapperAttribute.VALID = (
    _HEAD + "print(model.labels)\nmodel = nn.DataParallel(model)\nmodel.train()\nprint(model.module.labels, model.device_ids)\n",
    _HEAD + "model = nn.DataParallel(model)\nparams = sum(p.numel() for p in model.parameters())\n",
)
WrapperAttribute.INVALID = (
    Invalid.fixed_by(_HEAD + "model = nn.DataParallel(model)\nprint(model.labels)\n", old="model.labels", new="model.module.labels"),
    Invalid.fixed_by(
        _HEAD + "model = nn.DataParallel(model)\n\n\ndef first_weight(m):\n    return m.fc.weight[0]\n\n\nfirst_weight(model)\n",
        old="m.fc.weight", new="m.module.fc.weight",
    ),
)
