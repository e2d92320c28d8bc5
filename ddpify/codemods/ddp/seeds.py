"""Seed every RNG where the script asks for runs that repeat but nothing seeds torch (lint's DDP024),
as ddpify.codemods.seeds does for every target; not where the rows of a full batch are shared and
torch is drawn from: that transform seeds it after the imports, since every rank must draw the same
data (codemods/ddp/rows.py), and a second seed would only repeat it.
"""

from __future__ import annotations

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import TORCH
from ddpify.anatomy.full_batch import trains_without_loader, unseeded_rngs
from ddpify.codemods.options import Options
from ddpify.codemods.seeds import SeedWhereAskedFor


class SeedWhereReproducibilityIsAskedFor(SeedWhereAskedFor):
    """`seed_everything(0)` before the model where the script asks for it, unless the shared rows seed torch."""

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        seeded_by_rows = trains_without_loader(anatomy) and TORCH in unseeded_rngs(anatomy)
        return super().finds_work(anatomy, options) and not seeded_by_rows
