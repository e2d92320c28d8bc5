"""Each rank draws its own batches at random offsets, where the model returns the loss.

Char-level and GPT training scripts pick each step's batch at random offsets into one long token
tensor (`get_batch()`: `ix = torch.randint(len(data) - block_size, (batch_size,))`) and their model
returns the loss, so there is neither a sampler to add nor a loss call whose rows the ranks could
share (ddp/rows.py). The recipe of the DDP ports of such scripts (nanoGPT's) is that each rank draws
batches of its own and DDP averages the gradients: the script's seed call is made again with the
rank added (`torch.manual_seed(1337 + RANK)`) just before training starts, after the DDP wrap has
broadcast rank 0's weights; where that call can't be repeated there (its seed is another function's
variable), torch's current seed plus the rank (`torch.initial_seed() + RANK`). A script that seeds
nothing draws apart on each rank already: torch seeds each process apart. The batch stays per rank, so the global batch grows WORLD_SIZE times; with
`--batch-size global` each draw takes `batch_size // WORLD_SIZE` offsets instead. Training is then
statistically, not exactly, equivalent to the original (the ranks' draws are not the single
process's), and the advice says so: `ddpify verify` compares such runs in statistical mode.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import TORCH
from ddpify.anatomy.distributed.randomness import (
    batches_each_rank_draws, loops_around_backward, repeatable_at, seeded_alike, training_start,
)
from ddpify.anatomy.syntax import argument
from ddpify.codemods.base import PlannedOnTheWrapsMade
from ddpify.codemods.ddp.noise import noise_reseed, rank_seed, reseeded
from ddpify.codemods.ddp.runtime import RANK, WORLD_SIZE
from ddpify.codemods.ddp.samplers import DistributedSamplers, advise_learning_rate, divided_by_world_size
from ddpify.codemods.options import Options

_WHY = ("# ddpify: each rank draws its own batches from here on (the DDP wrap has\n"
        "# broadcast rank 0's weights, so the models stay identical).\n")
# where a draw of indices says how many it draws: torch.randint(high, size) / (low, high, size), torch.multinomial(input, num_samples)
_COUNT_ARGUMENTS = {"randint": "size", "multinomial": "num_samples"}


class BatchesOfEachRank(PlannedOnTheWrapsMade):
    """Each rank draws its own batches at random offsets: the seed made again with the rank."""

    NAME = "draws"
    DUTY = DistributedSamplers.DUTY  # the same duty: each rank trains on data of its own

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return bool(batches_each_rank_draws(anatomy))

    def plan(self) -> None:
        draws = batches_each_rank_draws(self.anatomy)
        if not self._drawn_apart(draws[0]):
            return
        if self.options.batch_size == "global":
            for draw in draws:
                self._divide_count(draw)
        else:
            advise_learning_rate(self)
        self.advise(draws[0].lineno, "each rank draws its own batches (as the DDP ports of GPT training scripts do) and DDP "
                                     "averages their gradients: training is statistically, not exactly, equivalent to the "
                                     "original (`ddpify verify` compares the runs in statistical mode)")
        self.fulfil()

    def _drawn_apart(self, draw: ast.Call) -> bool:
        """Make every rank draw apart: the seed call made again with the rank before training (the
        script's own where it can be repeated there, else torch's current seed plus the rank), unless
        nothing seeds torch alike (each process draws apart already) or the noise transform does it."""
        seed = seeded_alike(self.anatomy)
        if seed is None:
            return True
        start = training_start(self.anatomy, loops_around_backward(self.anatomy))
        if start is None:
            self._missing_own_draws(draw)
            return False
        call = reseeded(seed) if repeatable_at(self.anatomy, seed, start) else self._reseeded_from_current()
        if (noise_reseed(self.anatomy) or (None, None))[1] is not start:
            self.insert_before(start, f"{_WHY}{call}\n")
        self.changed(start.lineno, f"{call} before training: each rank draws its own batches "
                                   f"(`{ast.unparse(draw)}`), where every rank drew the same")
        return True

    def _reseeded_from_current(self) -> str:
        """torch's seed, as the script set it, plus the rank (within the 64 bits a seed may take)."""
        self.add_import(TORCH)
        return f"{TORCH}.manual_seed({rank_seed()})"

    def _divide_count(self, draw: ast.Call) -> None:
        """`torch.randint(n, (batch_size,))` -> `torch.randint(n, (batch_size // WORLD_SIZE,))`: the global batch kept."""
        count = _drawn_count(self.anatomy, draw)
        if count is None or not self.rewrite_expression(count, divided_by_world_size):  # type: ignore[arg-type]
            self.advise(draw.lineno, f"can't tell how many offsets `{ast.unparse(draw)}` draws: divide its batch size by "
                                     f"{WORLD_SIZE} by hand to keep the global batch (--batch-size global)")
            return
        self.changed(draw.lineno, f"{ast.unparse(count)} -> {ast.unparse(count)} // {WORLD_SIZE} offsets drawn on each rank "
                                  "(the global batch stays as in the original)")

    def _missing_own_draws(self, draw: ast.Call) -> None:
        self.missing(draw.lineno, f"the training batches are drawn at random offsets (`{ast.unparse(draw)}`) "
                                  "and the model returns the loss: every rank draws the same batches, so trains on the same data "
                                  "(found no statement after the DDP wrap, in its block, where training starts, to seed each rank apart before it)",
                     "give each rank its own draws, as the DDP ports of GPT training scripts do: "
                     f"torch.manual_seed(seed + {RANK}) once the model is wrapped, batch_size per rank (the global batch "
                     f"grows {WORLD_SIZE} times: divide batch_size by {WORLD_SIZE} to keep it); `ddpify verify` can then "
                     "show statistical equivalence only")


def _drawn_count(a: Anatomy, draw: ast.Call) -> ast.expr | None:
    """How many indices the draw picks: the first of randint's size (`(batch_size,)`), multinomial's num_samples."""
    name = (a.qualname(draw.func) or "").rpartition(".")[2]
    if name not in _COUNT_ARGUMENTS:
        return None
    positional = len(draw.args) - 1 if name == "randint" and len(draw.args) > 1 else 1  # randint's size comes last
    count = argument(draw, positional, _COUNT_ARGUMENTS[name])
    if name == "randint" and isinstance(count, (ast.Tuple, ast.List)):
        return count.elts[0] if count.elts else None
    return count if name == "multinomial" else None
