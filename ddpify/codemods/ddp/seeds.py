"""Seed every RNG where the script looks after reproducibility but nothing seeds torch (lint's DDP024).

A `--seed` option nothing reads, or `cudnn.deterministic = True` with torch unseeded: the single-GPU
script asks for runs that repeat and gets none, and its converted script says so (DDP024, a warning
that any multi-GPU script with that text earns, whoever wrote it). Seeding it is what the script
asked for and costs nothing it had: an unseeded script draws other numbers at every run anyway. So
the conversion calls `seed_everything(0)` before the model is built (ddpify.codemods.seeds), the
helper lint's fix adds; not where the rows of a full batch are shared and torch is drawn from: that
transform seeds it after the imports, since every rank must draw the same data (codemods/ddp/rows.py).
"""

from __future__ import annotations

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import TORCH
from ddpify.anatomy.distributed.seeding import looks_after_reproducibility, seeded_anywhere
from ddpify.anatomy.full_batch import trains_without_loader, unseeded_rngs
from ddpify.codemods.options import Options
from ddpify.codemods.seeds import SeedEveryRng


class SeedWhereReproducibilityIsAskedFor(SeedEveryRng):
    """`seed_everything(0)` before the model, where the script shows care for reproducibility and seeds torch nowhere."""

    WHY = "the script asks for runs that repeat (a seed option, a deterministic switch, a seed of another RNG) and seeds torch nowhere"

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        asked = bool(anatomy.trained_models) and looks_after_reproducibility(anatomy) and not seeded_anywhere(anatomy, TORCH)
        return asked and not (trains_without_loader(anatomy) and TORCH in unseeded_rngs(anatomy))
