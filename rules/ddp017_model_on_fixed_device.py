"""DDP017: the model put on the same GPU on every rank."""

from __future__ import annotations

import ast

from ddpify.anatomy import ROLE_MODEL
from ddpify.anatomy.distributed.launch import backends, env_writes
from ddpify.anatomy.distributed.ranks import mentions_rank
from ddpify.anatomy.distributed.reaching import reaching_values
from ddpify.anatomy.distributed.wrappers import wrap_calls
from ddpify.anatomy import syntax
from ddpify.anatomy.vocabulary import DEVICE_MOVES
from ddpify.lint import Finding, Invalid, Rule

FIXED = "fixed"      # cuda:N with a literal N
CURRENT = "current"  # "cuda" without an index: the current device, cuda:0 unless set_device was called


class ModelOnFixedDevice(Rule, code="DDP017", name="model-on-fixed-device", severity="error"):
    """## What it does
    Flags a model moved to a GPU that does not depend on the rank: `.to("cuda:0")`, `.cuda(1)`,
    `torch.device("cuda", 0)`, `DDP(model, device_ids=[0])`, and — when the script never calls
    `torch.cuda.set_device(...)` — `.cuda()`, `.to("cuda")` and `torch.device("cuda")` (which mean
    the *current* device, cuda:0 in every fresh process). Devices are followed through variables
    (`device = torch.device("cuda")` ... `model.to(device)`). Scripts that pick the GPU per rank by
    setting `CUDA_VISIBLE_DEVICES` from the rank are not checked, and the current device is judged
    only in the script that joins the process group (`init_process_group`): a module it imports
    inherits the GPU that script selects.

    ## Why is this bad?
    Every rank puts its replica on the same GPU: the other GPUs idle, that one runs out of memory,
    and NCCL fails with "Duplicate GPU detected" (or hangs) because two ranks share a device. With
    `device_ids=[0]` on a model that lives elsewhere, DDP refuses to start.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = Net().to("cuda")
    model = DDP(model)
    ```

    ## Use instead
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = Net().to(local_rank)
    model = DDP(model, device_ids=[local_rank])
    ```

    ## Fix safety
    No fix: the right device comes from the script's rank variable, which the rule cannot name
    reliably.
    """

    message = "model placed on the same GPU on every rank"

    def check(self, a):
        if any(mentions_rank(a, a.stmt_of.get(w, w)) for w in env_writes(a, "CUDA_VISIBLE_DEVICES")):
            return  # each rank sees only its own GPU, as cuda:0
        # `.cuda()` means the GPU of whoever joins the process group: judged where the group is joined
        selects_device = bool(a.calls_to("torch.cuda.set_device", "torch.cuda.device")) or not backends(a)
        for site in a.calls:
            placement = _model_placement(a, site.node)
            if placement == FIXED or (placement == CURRENT and not selects_device):
                yield Finding(site.pos, _MESSAGES[placement])
        for site in wrap_calls(a):
            for name in ("device_ids", "output_device"):
                kw = syntax.keyword(site.node, name)  # type: ignore[arg-type]
                if kw is not None and _has_int_literal(kw.value):
                    yield Finding(a.pos(kw), f"`{name}` names a fixed GPU: every rank uses the same device")


_MESSAGES = {
    FIXED: "model placed on a fixed GPU: every rank uses the same device; use the local rank",
    CURRENT: "model placed on the current CUDA device, cuda:0 on every rank (no torch.cuda.set_device call)",
}


def _model_placement(a, call: ast.Call) -> str | None:
    method = syntax.method_name(call)
    if method not in DEVICE_MOVES or not a.has_role(call.func.value, ROLE_MODEL):  # type: ignore[attr-defined]
        return None
    device = syntax.argument(call, 0, "device")
    if method == "cuda":
        return CURRENT if device is None else (FIXED if _has_int_literal(device) else None)
    return _device_kind(a, device, 0) if device is not None else None


def _device_kind(a, expr: ast.AST, depth: int) -> str | None:
    """FIXED, CURRENT or None (rank-dependent, CPU or unknown) for a device expression."""
    if depth > 8:
        return None
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return _cuda_string_kind(expr.value)
    if isinstance(expr, ast.Call) and a.qualname(expr.func) == "torch.device" and expr.args:
        kind = _device_kind(a, expr.args[0], depth + 1)
        index = syntax.argument(expr, 1, "index")
        if kind == CURRENT and index is not None:
            return FIXED if _has_int_literal(index) else None
        return kind
    if isinstance(expr, ast.IfExp):
        kinds = [_device_kind(a, e, depth + 1) for e in (expr.body, expr.orelse)]
        return FIXED if FIXED in kinds else (CURRENT if CURRENT in kinds else None)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        kinds = [_device_kind(a, v, depth + 1) for v in reaching_values(a, expr)]
        return kinds[0] if kinds and all(k == kinds[0] for k in kinds) else None
    return None


def _cuda_string_kind(text: str) -> str | None:
    if text == "cuda":
        return CURRENT
    if text.startswith("cuda:") and text[5:].isdigit():
        return FIXED
    return None


def _has_int_literal(expr: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and type(n.value) is int for n in ast.walk(expr))


_HEAD = """import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
"""

ModelOnFixedDevice.VALID = (
    _HEAD + "torch.cuda.set_device(local_rank)\nmodel = torch.nn.Linear(4, 1).cuda()\nmodel = DDP(model, device_ids=[local_rank])\n",
    _HEAD + "device = torch.device(f'cuda:{local_rank}')\nmodel = DDP(torch.nn.Linear(4, 1).to(device), device_ids=[local_rank])\n",
    _HEAD + "model = DDP(torch.nn.Linear(4, 1).to(local_rank), device_ids=[local_rank])\n",
    _HEAD + "device = torch.device('cuda', local_rank)\nmodel = DDP(torch.nn.Linear(4, 1).to(device))\n",
    # each rank sees only its own GPU, as cuda:0
    _HEAD + "os.environ['CUDA_VISIBLE_DEVICES'] = str(local_rank)\nmodel = DDP(torch.nn.Linear(4, 1).to('cuda:0'), device_ids=[0])\n",
    # a module the entry imports: the entry joins the group and selects this rank's GPU
    "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n\n"
    "def build(model):\n    return DDP(model.cuda())\n",
)
ModelOnFixedDevice.INVALID = (
    Invalid(_HEAD + "model = torch.nn.Linear(4, 1).to('cuda:0')\nmodel = DDP(model, device_ids=[local_rank])\n", line=8),
    Invalid(
        _HEAD + "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "model = torch.nn.Linear(4, 1)\nmodel.to(device)\nmodel = DDP(model)\n",
        line=10,
    ),
    Invalid(_HEAD + "torch.cuda.set_device(local_rank)\nmodel = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[0])\n", line=9),
)
