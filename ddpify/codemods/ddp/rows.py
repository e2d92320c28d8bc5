"""Ranks share the rows of each loss where no DataLoader feeds training.

Whole tensors (`x = torch.linspace(...)`), a graph's nodes picked by a train mask, batches cut by
hand (`x[i:i + bs]`): the data is the same on every rank, so there is no sampler to add. Each loss
call of a backward becomes `loss_of_rank_rows(criterion, output, target)`: the mean over this
rank's rows (every WORLD_SIZE-th), weighted by its share (a sum by WORLD_SIZE) so that DDP's gradient average is exactly
the single-process gradient, and valued as the whole batch's loss on every rank (one all_reduce of
a number), so prints, stop tests and LBFGS's closure see the single-process loss. Where the loss
takes a forward that works row by row (`criterion(model(x), y)`, anatomy/row_wise.py), each rank runs
that forward on its rows only, `model(rows_of_rank(x))`, against the same rows of the targets: the
ranks split the forward and backward too. Otherwise (a graph's forward mixes the rows of all its
nodes; BatchNorm; a forward this file can't see) the forward runs on the whole batch on every rank and
what the ranks split is the loss, the report says why. Where a loss is no plain
mean or sum over rows (class-weighted, a token mean, unreduced) or comes from the model itself, the data is
reported not sharded, naming why; where the model returns the loss of batches drawn at random
offsets (`get_batch()`), each rank draws its own instead (batch_draws.py).
"""

from __future__ import annotations

import ast
from typing import Callable

import libcst as cst

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import NUMPY, PYTHON, TORCH
from ddpify.anatomy.full_batch import RowForward, forward_on_rows, random_offset_draws, row_losses, trains_without_loader, unseeded_rngs
from ddpify.anatomy.losses import full_reduction, reduced_tensor, sums_over_batch
from ddpify.anatomy.model_losses import ModelRowLoss
from ddpify.anatomy.syntax import spelling
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.evaluation import add_helpers
from ddpify.codemods.ddp.runtime import MODEL_ROWS_CALL, RANK_ROWS_CALL, ROWS_CALL
from ddpify.codemods.ddp.samplers import DistributedSamplers
from ddpify.codemods.options import Options
from ddpify.edits.positions import last_leading_import

SEEDS = {TORCH: "torch.manual_seed", NUMPY: "numpy.random.seed", PYTHON: "random.seed"}
_SAME_DRAWS = "# ddpify: every rank draws the same data, so the ranks can share its rows.\n"


class RowsOfEachRank(Transform):
    """Each rank's share of the rows of every loss, where training reads no DataLoader."""

    NAME = "rows"
    SEES_EDITS_OF = ()  # its helper goes after setup's, there or pending (add_helpers)
    DUTY = DistributedSamplers.DUTY  # the same duty: the training data is split over the ranks

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return trains_without_loader(anatomy)

    def plan(self) -> None:
        losses = row_losses(self.anatomy)
        draws = random_offset_draws(self.anatomy)
        for line, why in losses.refusals:
            self._missing_rows(line, why)
        for line, why in losses.from_model if not draws else ():  # batches drawn at random offsets: each rank its own (ddp/batch_draws.py)
            self._missing_rows(line, why)
        if losses.refusals or losses.from_model or not (losses.calls or losses.model_calls) or not self._same_draws_on_every_rank():
            return
        helpers = {ROWS_CALL: losses.calls, MODEL_ROWS_CALL: losses.model_calls}
        if not add_helpers(self, {name for name, uses in helpers.items() if uses}):
            return
        for shared in losses.model_calls:
            self._share_model_loss(shared)
        for call in losses.calls:
            forward = forward_on_rows(self.anatomy, call)
            if isinstance(forward, RowForward):
                self._forward_on_rank_rows(call, forward)
            else:
                self._share_loss(call, forward)
        self.fulfil()

    def _share_loss(self, call: ast.Call, whole_forward: str) -> None:
        """`criterion(out, y)` -> `loss_of_rank_rows(criterion, out, y)`: the loss shared by rows, the forward whole."""
        by_hand = full_reduction(self.anatomy, call) is not None
        self.rewrite_expression(call, self._shared_by_hand(call) if by_hand else _shared)
        loss = ast.unparse(call) if by_hand else f"{ast.unparse(call.func)}(...)"
        self.changed(call.lineno, f"{loss} -> {ROWS_CALL}(...): each rank takes every WORLD_SIZE-th row of the batch, "
                                  f"{self._weight(call)} (the averaged gradient is the single-process one, exactly; the loss's "
                                  f"value is the whole batch's); every rank runs the forward on the whole batch: {whole_forward}")

    def _forward_on_rank_rows(self, call: ast.Call, forward: RowForward) -> None:
        """`criterion(model(x), y)` -> `loss_of_rank_rows(criterion, model(rows_of_rank(x)), rows_of_rank(y), rows=len(x))`
        (or the forward rewritten where `out = model(x)` binds it): the forward on this rank's rows only."""
        rows = ast.unparse(forward.rows)
        on_rows = f"{ast.unparse(forward.call.func)}({RANK_ROWS_CALL}({rows}))"
        output = on_rows if call.args[0] is forward.call else ast.unparse(call.args[0])
        targets = [f"{RANK_ROWS_CALL}({ast.unparse(arg)})" for arg in call.args[1:]]
        options = [ast.unparse(k) for k in call.keywords]
        shared = f"{ROWS_CALL}({', '.join([ast.unparse(call.func), output, *targets, *options, f'rows=len({rows})'])})"
        if call.args[0] is not forward.call:
            self.rewrite_expression(forward.call, lambda _: cst.parse_expression(on_rows))
        self.rewrite_expression(call, lambda _: cst.parse_expression(shared))
        self.changed(call.lineno, f"{ast.unparse(call.func)}(...) -> {ROWS_CALL}(...): each rank runs the forward on its rows of "
                                  f"`{rows}` only ({RANK_ROWS_CALL}: every WORLD_SIZE-th; the model works row by row) against "
                                  f"the same rows of the targets, {self._weight(call)} (the averaged gradient is the single-process "
                                  "one, exactly; the loss's value is the whole batch's)")

    def _weight(self, call: ast.Call) -> str:
        """How this rank's loss is weighted, said for the report."""
        return "its sum by WORLD_SIZE" if sums_over_batch(self.anatomy, call) else "its mean weighted by its share of the rows"

    def _share_model_loss(self, shared: ModelRowLoss) -> None:
        """`model(X, Y)` -> `model_loss_of_rank_rows(model, X, Y, loss_at=1, ignored=-1)`: forward on this rank's rows."""
        options = {"loss_at": shared.at, "targets": shared.targets, "ignored": shared.ignored}
        given = [f"{name}={value if isinstance(value, int) else ast.unparse(value)}" for name, value in options.items() if value is not None]
        code = ast.unparse(shared.call)
        arguments = ", ".join([ast.unparse(shared.call.func), *map(ast.unparse, shared.call.args), *given])
        self.rewrite_expression(shared.call, lambda _: cst.parse_expression(f"{MODEL_ROWS_CALL}({arguments})"))
        counted = "the targets not ignored" if shared.ignored is not None else "the rows"
        self.changed(shared.call.lineno, f"{code} -> {MODEL_ROWS_CALL}(...): each rank runs the model on every WORLD_SIZE-th row "
                                         f"of the batch, its loss weighted by its share of {counted} (the averaged gradient is the "
                                         "single-process one, exactly; the loss's value is the whole batch's)")

    def _shared_by_hand(self, call: ast.Call) -> Callable[[cst.CSTNode], cst.CSTNode]:
        """`x.sum()` (or `torch.sum(x)`) -> `loss_of_rank_rows(torch.sum, x)`: the rows of `x` shared."""
        reduction = f"{spelling(self.anatomy, TORCH)}.{full_reduction(self.anatomy, call)}"
        tensor = ast.unparse(reduced_tensor(call))
        return lambda _: cst.parse_expression(f"{ROWS_CALL}({reduction}, {tensor})")

    def _same_draws_on_every_rank(self) -> bool:
        """Seed the RNGs the data may be drawn from, where nothing does, right after the opening imports:
        torch seeds each process apart, so every rank would draw data of its own (False: no place)."""
        unseeded = unseeded_rngs(self.anatomy)
        if not unseeded:
            return True
        imports = last_leading_import(self.anatomy.tree)
        seeds = [spelling(self.anatomy, SEEDS[rng]) for rng in unseeded]
        if imports is None or None in seeds:
            self._missing_rows(1, f"{' and '.join(unseeded)} draw(s) the data but nothing seeds them, so each rank would draw its own")
            return False
        self.insert_after(imports, f"\n{_SAME_DRAWS}{''.join(f'{seed}(0)' + chr(10) for seed in seeds)}")
        self.changed(imports.lineno, f"{'(0), '.join(seeds)}(0) after the imports: nothing seeded the RNGs the data is drawn "
                                     "from (torch seeds each process apart), and every rank must draw the same data to share its rows")
        return True

    def _missing_rows(self, line: int, why: str) -> None:
        self.missing(line, f"the training data is not sharded (no DataLoader feeds it, and {why}): every rank trains on all of it",
                     "give each rank its rows of every batch (x[RANK::WORLD_SIZE]) and weight its mean loss by its rows * "
                     "WORLD_SIZE / all rows, or feed training from a DataLoader with a DistributedSampler")


def _shared(node: cst.CSTNode) -> cst.CSTNode:
    """`criterion(out, y)` -> `loss_of_rank_rows(criterion, out, y)`."""
    call: cst.Call = node  # type: ignore[assignment]
    first = cst.Arg(call.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(func=cst.Name(ROWS_CALL), args=[first, *call.args])
