"""DP006: checkpoints written from (or read into) the DataParallel wrapper, keys prefixed `module.`."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.reaching import reaching_values
from ddpify.anatomy import syntax
from ddpify.anatomy.vocabulary import STATE_DICT_METHODS, TORCH_LOAD
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import IN_MEMORY_COPY, saved_state_dict_cases
from ddpify.rules._ddp import is_saved, module_fix
from ddpify.rules._dp import is_dp_wrapper


class WrapperCheckpoint(Rule, code="DP006", name="dp-wrapper-checkpoint", severity="warning"):
    """## What it does
    Flags `model.state_dict()` saved with `torch.save` (directly, or through a checkpoint dict or
    variable that is saved) and `model.load_state_dict(...)` of a state dict read with
    `torch.load`, when `model` is the `nn.DataParallel` wrapper.

    ## Why is this bad?
    The wrapper holds the network as its `module` attribute, so every key of its state dict starts
    with `module.` (`module.fc.weight`). Such a checkpoint does not load into the plain model (for
    inference, or a single-GPU run): "Missing key(s) ... Unexpected key(s) module.fc.weight". The
    other way round, a checkpoint of the plain model does not load into the wrapper.

    ## Example
    ```python
    model = nn.DataParallel(net)
    torch.save(model.state_dict(), "model.pt")
    model.load_state_dict(torch.load("model.pt"))
    ```

    ## Use instead
    ```python
    torch.save(model.module.state_dict(), "model.pt")
    model.module.load_state_dict(torch.load("model.pt"))
    ```

    ## Fix safety
    Inserting `.module` before `state_dict()` is safe when the script loads no checkpoint into the
    wrapper. Loading into `.module` is unsafe: checkpoints saved from a wrapper before the fix have
    `module.` keys and load into the wrapper only.
    """

    message = "checkpoint of the DataParallel wrapper: its keys start with `module.`; use `model.module`"

    def check(self, a):
        calls = [(site, site.node.func.value) for site in a.calls if syntax.method_name(site.node) in STATE_DICT_METHODS]  # type: ignore[attr-defined]
        calls = [(site, receiver) for site, receiver in calls if is_dp_wrapper(a, receiver)]
        loads = [(site, receiver) for site, receiver in calls if syntax.method_name(site.node) == "load_state_dict" and _reads_checkpoint(a, site.node)]
        for site, receiver in loads:
            fix = module_fix(a, receiver, safe=False, description="load into `.module`")
            yield Finding(site.pos, "load_state_dict on the DataParallel wrapper expects `module.` keys; load into `model.module`", fix)
        for site, receiver in calls:
            if syntax.method_name(site.node) == "state_dict" and is_saved(a, site.node):
                fix = module_fix(a, receiver, safe=not loads, description="save the state dict of `.module`")
                yield Finding(site.pos, "state_dict() of the DataParallel wrapper is saved: its keys start with `module.`", fix)


def _reads_checkpoint(a, call: ast.Call) -> bool:
    """Does the state dict passed to `load_state_dict` come from `torch.load`?"""
    if not call.args:
        return False
    values = [call.args[0]] + [v for n in ast.walk(call.args[0]) if isinstance(n, ast.Name) for v in reaching_values(a, n)]
    return any(isinstance(n, ast.Call) and a.qualname(n.func) == TORCH_LOAD for v in values for n in ast.walk(v))


_HEAD = "import torch\nfrom torch import nn\n\nmodel = nn.DataParallel(nn.Linear(4, 2))\n"

WrapperCheckpoint.VALID = (
    _HEAD + "torch.save(model.module.state_dict(), 'model.pt')\nmodel.module.load_state_dict(torch.load('model.pt'))\n",
    _HEAD + IN_MEMORY_COPY,
)
WrapperCheckpoint.INVALID = (
    *saved_state_dict_cases(_HEAD),
    Invalid.fixed_by(
        _HEAD + "checkpoint = torch.load('ckpt.pt')\nmodel.load_state_dict(checkpoint['model'])\n",
        old="model.load_state_dict", new="model.module.load_state_dict",
    ),
)
