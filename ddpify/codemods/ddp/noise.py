"""Transform (advice only): ranks that draw the same noise.

A script that seeds torch's global RNG once runs that seed on every rank, so a draw in the training
step (`noise = torch.randn(batch, nz)`) gives every rank the same values: not wrong, but each
rank's part of the global batch sees the same noise. The advice says how to give each rank its own.
"""

from __future__ import annotations

from ddpify.anatomy import Anatomy
from ddpify.anatomy import distributed as ddp
from ddpify.codemods.base import Options, Transform


class SameNoiseOnEveryRank(Transform):
    """Advise where every rank draws the same random values in its training steps."""

    NAME = "noise"

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return bool(ddp.draws_alike_on_every_rank(anatomy))  # seeds and draws are the user's; no transform adds one

    def plan(self) -> None:
        for draw in ddp.draws_alike_on_every_rank(self.anatomy):
            self.advise(draw.lineno, "every rank draws the same values here (the global RNG is seeded alike on every rank): "
                                     "to give each rank its own, seed with the rank once the model is wrapped, e.g. "
                                     "`torch.manual_seed(seed + RANK)` just before the training loop (DDP has already "
                                     "broadcast rank 0's weights, so the models stay identical)")
