"""Rank-0 duties the Accelerate way: the DDP target's judgement (ddpify.codemods.ddp.rank_zero),
written with the Accelerator: `accelerator.print`, `accelerator.save`, `if
accelerator.is_main_process:` for other output, `accelerator.wait_for_everyone()` before other
processes read a checkpoint, `torch.load(..., map_location=accelerator.device)`.

A SummaryWriter is built on the main process only; the other processes hold the DDP target's
stand-in, whose calls do nothing, with the attributes the script reads of it broadcast from the main
process (accelerate.utils.broadcast_object_list; spelled.py). A wandb run is started as the DDP
target starts it: on every process, `mode="disabled"` off the main one (the script's own
`wandb.init` kept rather than moved to `accelerator.init_trackers`, which starts wandb on the main
process alone: the others' `wandb.config` reads would fail as before).
"""

from __future__ import annotations

import ast
from ddpify.anatomy.vocabulary import TORCH_SAVE
from ddpify.codemods.accelerate.spelled import SpelledWithTheAccelerator
from ddpify.codemods.accelerate.runtime import BARRIER, DEVICE, OFF_MAIN_PROCESS, ON_MAIN_PROCESS, PRINT, SAVE
from ddpify.codemods.ddp.rank_zero import RankZeroDuties
from ddpify.edits.expressions import parse_expr

# The rank-0 outputs Accelerate has a call for, which writes on the main process alone.
_OWN_CALLS = {"print": PRINT, TORCH_SAVE: SAVE}


class AcceleratorRankZero(SpelledWithTheAccelerator, RankZeroDuties):
    """Print, log, save and write files on the main process only (Accelerate's calls where it has them)."""

    ON_RANK_ZERO = ON_MAIN_PROCESS
    OFF_RANK_ZERO = OFF_MAIN_PROCESS
    RANK_DEVICE = DEVICE
    BARRIER = BARRIER
    SEES_EDITS_OF = ()

    def keep_on_rank_zero(self, stmt: ast.stmt, kind: str) -> None:
        """`print(...)` -> `accelerator.print(...)`, `torch.save(obj, path)` -> `accelerator.save(obj, path)`;
        other output under `if accelerator.is_main_process:`."""
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        own = _OWN_CALLS.get(kind)
        if own is None or not isinstance(call, ast.Call) or self.anatomy.qualname(call.func) != kind or not _plain_save(call, kind):
            super().keep_on_rank_zero(stmt, kind)
            return
        self.rewrite_expression(call.func, lambda _: parse_expr(own))
        self.changed(stmt.lineno, f"{kind} -> {own} (on the main process only)")


def _plain_save(call: ast.Call, kind: str) -> bool:
    """`torch.save(obj, path)` with nothing else, which `accelerator.save(obj, path)` takes (any print does)."""
    return kind != TORCH_SAVE or (len(call.args) == 2 and not call.keywords)
