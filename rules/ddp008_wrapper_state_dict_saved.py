"""DDP008: a checkpoint saved from the DDP wrapper's state_dict (keys prefixed `module.`)."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.wrappers import is_wrapper, wrap_calls
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import IN_MEMORY_COPY, saved_state_dict_cases
from ddpify.rules._ddp import is_saved, module_fix


class WrapperStateDictSaved(Rule, code="DDP008", name="wrapper-state-dict-saved", severity="warning"):
    """## What it does
    Flags `model.state_dict()` saved with `torch.save` (directly, or through a checkpoint dict or
    variable that is saved) when `model` is the `DistributedDataParallel` wrapper.

    ## Why is this bad?
    The wrapper holds the network as its `module` attribute, so every key of its state dict starts
    with `module.` (`module.fc.weight`). Loading that checkpoint into the plain model, for
    inference or a single-GPU run, fails with "Missing key(s) ... Unexpected key(s) module.fc.weight"
    unless every loader strips the prefix.

    ## Example
    ```python
    model = DDP(net, device_ids=[local_rank])
    torch.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    torch.save(model.module.state_dict(), "model.pt")
    ```

    ## Fix safety
    Inserts `.module`. Safe when the script itself never loads a state dict into the wrapper;
    unsafe when it does (`model.load_state_dict(...)` on the wrapper would now miss the prefix:
    fix that call too, see DDP009).
    """

    message = "state_dict() of the DDP wrapper is saved: its keys start with `module.`; save `model.module.state_dict()`"

    def check(self, a):
        if not wrap_calls(a):
            return
        safe = not _loads_into_wrapper(a)
        for site in a.calls:
            call: ast.Call = site.node  # type: ignore[assignment]
            if syntax.method_name(call) != "state_dict" or not is_wrapper(a, call.func.value):  # type: ignore[attr-defined]
                continue
            if is_saved(a, call):
                fix = module_fix(a, call.func.value, safe=safe, description="save the state dict of `.module`")  # type: ignore[attr-defined]
                yield Finding(site.pos, fix=fix)


def _loads_into_wrapper(a) -> bool:
    return any(
        syntax.method_name(c.node) == "load_state_dict" and is_wrapper(a, c.node.func.value)  # type: ignore[attr-defined]
        for c in a.calls
    )


_HEAD = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
net = torch.nn.Linear(4, 1)
model = DDP(net)
"""

WrapperStateDictSaved.VALID = (
    _HEAD + "if dist.get_rank() == 0:\n    torch.save(model.module.state_dict(), 'model.pt')\n",
    _HEAD + "torch.save(net.state_dict(), 'model.pt')\n",
    _HEAD + IN_MEMORY_COPY,
)
WrapperStateDictSaved.INVALID = (
    *saved_state_dict_cases(_HEAD),
    Invalid(
        """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, net):
        self.model = DDP(net)

    def save(self, path):
        state = {}
        state["model"] = self.model.state_dict()
        torch.save(state, path)


dist.init_process_group("gloo")
Trainer(torch.nn.Linear(2, 2)).save("ckpt.pt")
""",
        line=12,
    ),
)
