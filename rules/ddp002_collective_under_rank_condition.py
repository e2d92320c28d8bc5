"""DDP002: a collective or a DDP forward that only some ranks reach."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.every_rank_work import collectives
from ddpify.anatomy.distributed.ranks import rank_guard, rank_guarded
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import ACCELERATE_HEAD, ON_MAIN_PROCESS
from ddpify.rules._ddp import DDP_AND_ACCELERATE, inner_model, is_ddp_wrapper, module_fix, wraps_models


class CollectiveUnderRankCondition(Rule, code="DDP002", name="collective-under-rank-condition", severity="error"):
    """## What it does
    Flags a collective (`dist.all_reduce`, `dist.barrier`, `dist.broadcast`, `dist.all_gather`, ...,
    and the distributed checkpoint's `dcp.save` / `dcp.load`, which every rank joins with its shards)
    or a forward pass of the DDP-wrapped model that only some ranks reach: it sits under
    `if rank == 0:` (or `if dist.get_rank() == 0`, `if is_main_process():`, ...), after an early
    `return` taken by the other ranks, or in a function that is only called from such places.

    In a Hugging Face Accelerate script the collectives are the Accelerator's
    (`accelerator.wait_for_everyone()`, `gather`, `gather_for_metrics`, `reduce`,
    `pad_across_processes`), the rank tests `accelerator.is_main_process`,
    `is_local_main_process` and `accelerator.process_index == 0`, and the wrapped model is the
    one `accelerator.prepare` returned (its plain module: `accelerator.unwrap_model(model)`).

    ## Why is this bad?
    A collective completes only when every rank of the group calls it. When only rank 0 calls it,
    rank 0 waits forever for the others (and they wait for rank 0 at their next collective): the
    job hangs until the NCCL timeout kills it. A DDP forward is a collective too: it broadcasts
    buffers (e.g. BatchNorm statistics) from rank 0, and its backward all-reduces gradients.

    A matched pair in complementary branches (`if rank != 0: dist.barrier()` ... `if rank == 0:
    dist.barrier()`, the "rank 0 first" idiom) is fine and not reported.

    ## Example
    ```python
    if rank == 0:
        dist.all_reduce(loss)
        print(loss.item())
    ```

    ## Use instead
    ```python
    dist.all_reduce(loss)
    if rank == 0:
        print(loss.item())
    ```
    and evaluate on rank 0 only through the plain module: `model.module(x)`
    (`accelerator.unwrap_model(model)(x)` under Accelerate).

    ## Fix safety
    A DDP forward gets an unsafe fix that calls `model.module(...)` (or
    `accelerator.unwrap_model(model)(...)`) instead (no synchronisation;
    unsafe because gradients of a backward through it are no longer averaged). Collectives have no
    fix: whether to move them out of the branch or drop them needs a decision.
    """

    message = "collective runs on some ranks only; the other ranks never join it and the job hangs"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        for site in collectives(a):
            if rank_guarded(a, site.node) and not _has_complementary_partner(a, site):
                name = site.qualname.rpartition(".")[2]
                yield Finding(site.pos, f"`{name}` runs on some ranks only; the other ranks never join it and the job hangs")
        for call in _guarded_ddp_forwards(a):
            yield Finding(
                a.pos(call),
                "forward of the DDP wrapper runs on some ranks only (it syncs buffers and gradients "
                f"with all ranks); call the plain module (`{inner_model(a, call.func)}(...)`) for rank-0-only work",
                module_fix(a, call.func, safe=False, description="call the module inside the DDP wrapper"),
            )


def _branch(a, node: ast.AST) -> tuple[ast.AST | None, bool]:
    guard = rank_guard(a, node)
    if guard is None:
        return None, False
    in_else = any(child in guard.orelse for parent, child in syntax.ancestors(a, node) if parent is guard)
    return guard, in_else


def _has_complementary_partner(a, site) -> bool:
    """The same collective, in the same function, in a different rank branch (`zero_first` idiom)."""
    scope, branch = syntax.enclosing_function(a, site.node), _branch(a, site.node)
    return any(
        other is not site
        and other.qualname == site.qualname
        and syntax.enclosing_function(a, other.node) == scope
        and rank_guarded(a, other.node)
        and _branch(a, other.node) != branch
        for other in collectives(a)
    )


def _guarded_ddp_forwards(a) -> list[ast.Call]:
    if not wraps_models(a):
        return []
    return [
        site.node
        for site in a.calls
        if isinstance(site.node.func, (ast.Name, ast.Attribute))
        and is_ddp_wrapper(a, site.node.func)
        and rank_guarded(a, site.node)
    ]


_HEAD = """import torch.distributed as dist
import torch
dist.init_process_group("nccl")
rank = dist.get_rank()
"""

CollectiveUnderRankCondition.VALID = (
    _HEAD + "loss = torch.ones(1)\ndist.all_reduce(loss)\nif rank == 0:\n    print(loss.item())\n",
    # the "rank 0 first" idiom: every rank reaches exactly one barrier
    _HEAD + "if rank != 0:\n    dist.barrier()\ndata = torch.ones(3)\nif rank == 0:\n    dist.barrier()\n",
    # `local_rank != -1` asks "distributed at all?": the same on every rank
    """import os
import torch.distributed as dist
local_rank = int(os.environ.get("LOCAL_RANK", -1))
if local_rank != -1:
    dist.init_process_group("nccl")
    dist.barrier()
""",
    # Accelerate: every process waits, then the main process prints; rank-0 evaluation through unwrap_model
    ACCELERATE_HEAD + "accelerator.wait_for_everyone()\nif accelerator.is_main_process:\n    print('done')\n",
    ACCELERATE_HEAD + f"if {ON_MAIN_PROCESS}:\n    out = accelerator.unwrap_model(model)(torch.ones(1, 4))\n",
    # rank-0 evaluation through the plain module
    _HEAD + """from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(torch.nn.Linear(2, 2))
if rank == 0:
    with torch.no_grad():
        out = model.module(torch.ones(1, 2))
""",
)
CollectiveUnderRankCondition.INVALID = (
    Invalid(ACCELERATE_HEAD + f"if {ON_MAIN_PROCESS}:\n    accelerator.wait_for_everyone()\n", line=ACCELERATE_HEAD.count("\n") + 2),
    Invalid(ACCELERATE_HEAD + "if accelerator.process_index == 0:\n    total = accelerator.gather(torch.ones(1))\n",
            line=ACCELERATE_HEAD.count("\n") + 2),
    Invalid.fixed_by(ACCELERATE_HEAD + f"if {ON_MAIN_PROCESS}:\n    out = model(torch.ones(1, 4))\n",
                     old="model(torch.ones(1, 4))", new="accelerator.unwrap_model(model)(torch.ones(1, 4))"),
    Invalid(_HEAD + "loss = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(loss)\n", line=7),
    Invalid(_HEAD + "import torch.distributed.checkpoint as dcp\nif rank == 0:\n    dcp.save({'w': torch.ones(1)}, checkpoint_id='ckpt')\n", line=7),
    Invalid(_HEAD + "if dist.get_rank() == 0:\n    dist.barrier()\n", line=6),
    Invalid(
        """import torch
import torch.distributed as dist


def is_main_process():
    return dist.get_rank() == 0


def log_metrics(loss):
    dist.all_reduce(loss)
    print(loss.item())


def main():
    dist.init_process_group("nccl")
    if is_main_process():
        log_metrics(torch.ones(1))
""",
        line=10,
    ),
    Invalid(
        """import torch.distributed as dist


def finish(rank):
    if rank != 0:
        return
    dist.barrier()


dist.init_process_group("gloo")
finish(dist.get_rank())
""",
        line=7,
    ),
    Invalid.fixed_by(
        _HEAD + """from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(torch.nn.Linear(2, 2))
if rank == 0:
    out = model(torch.ones(1, 2))
""",
        old="model(torch.ones(1, 2))", new="model.module(torch.ones(1, 2))",
    ),
)
