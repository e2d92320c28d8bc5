"""DP005: the model's own attributes read through the DataParallel wrapper."""

from __future__ import annotations

import ast

from ddpify.anatomy.scatter_gather import forward_aliases_of, training_method_call
from ddpify.anatomy.vocabulary import DP_WRAPPER, wrapper_lacks
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit
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

    A method called in a training step (its result is back-propagated) must not go through
    `.module` either: DataParallel parallelises `forward` alone, so `model.module.compute_loss(x, y)`
    trains on one GPU. A method that only calls forward (`return self(x)`) is called through the
    wrapper instead; any other belongs in forward.

    ## Fix safety
    Inserting `.module` is safe: the line raised `AttributeError` before. So is calling the wrapper
    for a method whose whole body is `return self(<its arguments>)`. A training step's other methods
    get no fix.
    """

    message = "attribute of the model read through the DataParallel wrapper; use `.module`"

    def check(self, a):
        for node in a.nodes:
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
                continue
            if not wrapper_lacks(DP_WRAPPER, node.attr) or not is_dp_wrapper(a, node.value):
                continue
            if training_method_call(a, node) is None:
                fix = module_fix(a, node.value, safe=True, description=f"read `{node.attr}` from `.module`")
                yield Finding(a.pos(node), f"DataParallel has no attribute `{node.attr}` (AttributeError); use `.module.{node.attr}`", fix)
            else:
                yield _training_method(a, node)


def _training_method(a, node: ast.Attribute) -> Finding:
    """`model.<method>(...)` in a training step: through `.module` it would train on one GPU; a method
    that only calls forward is fixed into a call of the wrapper."""
    wrapper = ast.unparse(node.value)
    if node.attr not in forward_aliases_of(a, node.value):
        return Finding(a.pos(node), f"the training step calls `{wrapper}.{node.attr}(...)`, which DataParallel does not parallelise (it "
                                    f"runs forward alone): through `.module` it would train on one GPU; compute it in forward and call `{wrapper}(...)`")
    edit = expression_edit(a, node, lambda attr: attr.value)  # type: ignore[attr-defined]
    fix = Fix((edit,), safe=True, description=f"call the wrapper: `{node.attr}` only calls forward") if edit else None
    return Finding(a.pos(node), f"`{node.attr}` only calls forward: call the wrapper, `{wrapper}(...)`, so DataParallel runs it on every GPU", fix)


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
    # a training step through a method that only calls forward: call the wrapper
    Invalid.fixed_by(_HEAD.replace("        return self.fc(x)\n", "        return self.fc(x)\n\n    def predict(self, x):\n        return self(x)\n")
                     + "model = nn.DataParallel(model)\nmodel.predict(torch.randn(8, 4)).sum().backward()\n",
                     old="model.predict(", new="model("),
    # another method: no fix, it belongs in forward
    Invalid(_HEAD.replace("        return self.fc(x)\n", "        return self.fc(x)\n\n    def loss(self, x):\n        return self.fc(x).sum()\n")
            + "model = nn.DataParallel(model)\nmodel.loss(torch.randn(8, 4)).backward()\n", line=20),
    Invalid.fixed_by(
        _HEAD + "model = nn.DataParallel(model)\n\n\ndef first_weight(m):\n    return m.fc.weight[0]\n\n\nfirst_weight(model)\n",
        old="m.fc.weight", new="m.module.fc.weight",
    ),
)
