"""A loss summed over the batch keeps its single-process gradient: backward on `loss * WORLD_SIZE`.

DDP (and FSDP) average gradients over the ranks. For a per-sample mean that is the mean over the
global batch; for `reduction='sum'` it is the ranks' mean of their sums, WORLD_SIZE times smaller
than the sum over the same samples in one process. Only a loss whose every loss term sums is
scaled; a mix of summed and averaged terms is left to the user, with advice. So is a term that pairs
the batch's rows with each other, which no rank can compute from its own rows (ddp/paired_rows.py).
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy.distributed.every_rank_work import PendingEdits
from ddpify.anatomy.full_batch import backward_loss
from ddpify.anatomy.losses import loss_terms, sums_over_batch, token_mean
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.paired_rows import keep_pairs_per_rank
from ddpify.codemods.ddp.runtime import WORLD_SIZE
from ddpify.edits.expressions import cst_type_of



class SumLossScaling(Transform):
    """Scale a loss summed over the batch by WORLD_SIZE before backward (ranks average gradients)."""

    NAME = "sum_loss"
    SEES_EDITS_OF = ("rows",)  # a loss whose rows the ranks share (rows.py) is weighted there, sums included
    PLANS_AHEAD_OF = ("rows",)
    WORLD_SIZE = WORLD_SIZE  # how the script spells the number of processes

    def plan(self) -> None:
        for site in self.anatomy.training_calls:
            call: ast.Call = site.node  # type: ignore[assignment]
            if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
                self._plan_backward(site.line, backward_loss(self.anatomy, call.func.value))
        keep_pairs_per_rank(self, self.WORLD_SIZE)

    def reads_pending_edits(self, pending: PendingEdits) -> bool:
        """Planned ahead of the rows each rank shares: a plan that found nothing holds. Those edits make
        each loss of a backward a share of its rows (`loss_of_rank_rows(...)`, weighted there, sums
        included), run its forward on `rows_of_rank(...)`, and add seeds and helpers: they take away what
        this plan looks for (a summed term, a token mean, a reduction chosen at run time, a term pairing
        rows), never add it. A plan that found some is made again on their output."""
        return bool(self.edits or self.report.changes or self.report.advice or self.report.missing)

    def _plan_backward(self, line: int, loss: ast.expr) -> None:
        tokens = token_mean(self.anatomy, loss)
        if tokens:
            self.advise(line, f"{tokens}: ranks average their gradients, so a rank with fewer tokens weighs each of them "
                              f"more than one process would (the mean of the ranks' means is not the mean over all tokens); "
                              f"for the exact token mean, back-propagate this rank's token sum * {self.WORLD_SIZE} / (the token "
                              f"count all_reduce'd over the ranks)")
        terms = loss_terms(self.anatomy, loss)
        reductions = [sums_over_batch(self.anatomy, t) for t in terms]
        if None in reductions:
            self.advise(line, f"the loss's reduction is chosen at run time: if it is 'sum', back-propagate loss * {self.WORLD_SIZE} "
                              f"(ranks average gradients)")
            return
        summed = [t for t, sums in zip(terms, reductions) if sums]
        if not summed:
            return
        if len(summed) < len(terms) or cst_type_of(loss) is None:
            self.advise(line, f"the loss adds terms summed over the batch (reduction='sum') to averaged ones: ranks average "
                              f"gradients, so multiply only the summed terms by {self.WORLD_SIZE}")
            return
        code = ast.unparse(loss)
        self.rewrite_expression(loss, lambda _: cst.parse_expression(f"({code} * {self.WORLD_SIZE})"))
        self.changed(line, f"the loss sums over the batch (reduction='sum') and ranks average gradients: backward on "
                           f"{code} * {self.WORLD_SIZE} keeps the single-process sum")
