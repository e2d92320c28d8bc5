"""A loss summed over the batch keeps its single-process gradient: backward on `loss * WORLD_SIZE`.

DDP (and FSDP) average gradients over the ranks. For a per-sample mean that is the mean over the
global batch; for `reduction='sum'` it is the ranks' mean of their sums, WORLD_SIZE times smaller
than the sum over the same samples in one process. Only a loss whose every loss term sums is
scaled; a mix of summed and averaged terms is left to the user, with advice.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import ROLE_SCALER, Anatomy
from ddpify.anatomy.full_batch import trains_without_loader
from ddpify.anatomy.losses import loss_terms, sums_over_batch, token_mean
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import WORLD_SIZE
from ddpify.codemods.options import Options
from ddpify.edits.expressions import cst_type_of



class SumLossScaling(Transform):
    """Scale a loss summed over the batch by WORLD_SIZE before backward (ranks average gradients)."""

    NAME = "sum_loss"
    SEES_EDITS_OF = ()

    WORLD_SIZE = WORLD_SIZE  # how the script spells the number of processes
    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        # with no DataLoader, a DDP conversion shares each loss's rows, a sum weighted by WORLD_SIZE
        # there (rows.py); other targets leave such data unsharded, incomplete
        return not trains_without_loader(anatomy)

    def plan(self) -> None:
        for site in self.anatomy.training_calls:
            call: ast.Call = site.node  # type: ignore[assignment]
            if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
                self._plan_backward(site.line, self._loss_of(call.func.value))

    def _loss_of(self, receiver: ast.expr) -> ast.expr:
        """`loss` in `loss.backward()` and in `scaler.scale(loss).backward()`."""
        if (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) and receiver.func.attr == "scale"
                and receiver.args and self.anatomy.has_role(receiver.func.value, ROLE_SCALER)):
            return receiver.args[0]
        return receiver

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
