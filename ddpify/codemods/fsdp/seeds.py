"""Seed every RNG before the model is built, where a script converted to FSDP seeds torch nowhere.

`fully_shard` broadcasts nothing: each rank keeps its own initialisation of its shard, so an unseeded
script would train a mix of WORLD_SIZE initialisations (lint rule DDP023). The helper and its call
are ddpify.codemods.seeds'.
"""

from __future__ import annotations

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import TORCH
from ddpify.anatomy.distributed.seeding import seeded_before
from ddpify.codemods.options import Options
from ddpify.codemods.seeds import SeedEveryRng


class SeedBeforeShard(SeedEveryRng):
    """Seed every RNG before the first trained model is built, where torch is seeded nowhere before it."""

    WHY = "fully_shard keeps each rank's own initialisation of its shard, so every rank must draw the same one"

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        models = anatomy.trained_models
        return bool(models) and not seeded_before(anatomy, models[0].stmt, TORCH)
