"""DDP001: `torch.load()` without `map_location` in a distributed script."""

from __future__ import annotations

import ast
from typing import Iterable

from ddpify.anatomy import MODULE_SCOPE, Anatomy, CallSite
from ddpify.anatomy.distributed.accelerate import accelerator_spelling
from ddpify.anatomy.vocabulary import TORCH_LOAD
from ddpify.edits.expressions import add_keyword
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit
from ddpify.rules._cases import ACCELERATE_HEAD
from ddpify.rules._ddp import DDP_AND_ACCELERATE, per_rank_target


class TorchLoadWithoutMapLocation(Rule, code="DDP001", name="torch-load-without-map-location", severity="error"):
    """
    ## What it does
    Checks for `torch.load(...)` calls without a `map_location` in scripts that run one process
    per GPU (`init_process_group`, `DistributedDataParallel`, `mp.spawn`, an Accelerate `Accelerator()`).

    ## Why is this bad?
    Without `map_location`, tensors are restored onto the device they were saved from, which for a
    checkpoint written by rank 0 is `cuda:0`. Every rank then allocates the whole checkpoint on
    GPU 0: it runs out of memory, or silently slows down while GPU 0 holds N copies.

    ## Example
    ```python
    checkpoint = torch.load("checkpoint.pt")
    model.load_state_dict(checkpoint["model"])
    ```

    ## Use instead
    ```python
    checkpoint = torch.load("checkpoint.pt", map_location=device)  # this rank's device
    model.load_state_dict(checkpoint["model"])
    ```

    ## Fix safety
    The fix adds `map_location=<device>` when the function (or module) binds a `torch.device(...)`
    or a variable named `device` before the call, or `map_location=accelerator.device` in an
    Accelerate script; that is safe, it is where this rank's tensors belong. Otherwise it adds `map_location="cpu"`, which is unsafe: `load_state_dict` copies
    CPU tensors to the model's device, but tensors used directly would now stay on the CPU.
    """

    message = "torch.load() without map_location loads every rank's copy onto the GPU it was saved from (usually cuda:0)"
    applies_to = DDP_AND_ACCELERATE

    VALID = (
        "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
        "state = torch.load('ckpt.pt', map_location='cpu')\n",
        "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
        "state = torch.load('ckpt.pt', 'cpu')\n",
        "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
        "state = torch.load('ckpt.pt', **load_kwargs)\n",
        # a rank's own file, saved from its own GPU, goes back to it (SwAV's per-rank queue)
        "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
        "queue = torch.load(f'queue{dist.get_rank()}.pth')\n",
        # single-GPU script: one process, nothing to collide with
        "import torch\n\nstate = torch.load('ckpt.pt')\n",
        ACCELERATE_HEAD + "state = torch.load('ckpt.pt', map_location=accelerator.device)\n",
    )
    INVALID = (
        Invalid.fixed_by(
            "import torch\nimport torch.distributed as dist\n\n\ndef main(local_rank):\n"
            "    dist.init_process_group('nccl')\n"
            "    device = torch.device('cuda', local_rank)\n"
            "    state = torch.load('ckpt.pt')\n",
            old="torch.load('ckpt.pt')", new="torch.load('ckpt.pt', map_location=device)",
        ),
        Invalid.fixed_by(
            "import torch\nimport torch.multiprocessing as mp\n\n\ndef worker(rank):\n"
            "    state = torch.load(\n        'ckpt.pt',\n    )\n\n\nmp.spawn(worker, nprocs=2)\n",
            old="        'ckpt.pt',\n", new="        'ckpt.pt',\n        map_location=\"cpu\",\n", line=6,
        ),
        # every Accelerate process loads onto the GPU the file was saved from
        Invalid.fixed_by(ACCELERATE_HEAD + "state = torch.load('ckpt.pt')\n",
                         old="torch.load('ckpt.pt')", new="torch.load('ckpt.pt', map_location=accelerator.device)"),
    )

    def check(self, anatomy: Anatomy) -> Iterable[Finding]:
        for site in anatomy.calls_to(TORCH_LOAD):
            call: ast.Call = site.node  # type: ignore[assignment]
            if _lacks_map_location(call) and not per_rank_target(anatomy, call.args[0]):  # a rank's own file goes back to its own GPU
                yield Finding(site.pos, fix=_fix(anatomy, site, call))


def _lacks_map_location(call: ast.Call) -> bool:
    """One positional argument, no `map_location=`, nothing unpacked that could hold it."""
    if len(call.args) != 1 or isinstance(call.args[0], ast.Starred):
        return False
    return all(kw.arg not in ("map_location", None) for kw in call.keywords)


def _fix(anatomy: Anatomy, site: CallSite, call: ast.Call) -> Fix | None:
    """`map_location=<device>` appended with convert's `add_keyword`, keeping the call's layout."""
    device = _device_name(anatomy, site)
    value = device or '"cpu"'
    edit = expression_edit(anatomy, call, lambda node: add_keyword(node, "map_location", value))  # type: ignore[arg-type,return-value]
    return Fix((edit,), safe=device is not None, description=f"Add map_location={value}") if edit else None


def _device_name(anatomy: Anatomy, site: CallSite) -> str | None:
    """A variable holding this process's device, bound before the call where the call can see it, or
    the Accelerator's `accelerator.device`."""
    visible = _bound_names(anatomy, site.scope, site.pos.line)
    if site.scope != MODULE_SCOPE:
        visible = {**_bound_names(anatomy, MODULE_SCOPE, None), **visible}
    devices = [name for name, is_device in visible.items() if is_device]
    if devices:
        return devices[0]
    accelerator = accelerator_spelling(anatomy, site.scope)
    if accelerator is not None:
        return f"{accelerator}.device"
    return "device" if "device" in visible else None


def _bound_names(anatomy: Anatomy, scope: str, before_line: int | None) -> dict[str, bool]:
    """Names assigned (or taken as parameters) in `scope` -> is the value a `torch.device(...)`?"""
    fn = anatomy.functions.get(scope)
    found = {p: False for p in fn.params} if fn else {}
    body = fn.node.body if fn else anatomy.tree.body
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign) and (before_line is None or node.lineno < before_line):
                is_device = isinstance(node.value, ast.Call) and anatomy.qualname(node.value.func) == "torch.device"
                for target in node.targets:
                    if isinstance(target, ast.Name) and anatomy.scope_of.get(target) == scope:
                        found[target.id] = found.get(target.id, False) or is_device
    return found
