"""Seed every RNG before the model is built, where a script converted to FSDP seeds torch nowhere.

`fully_shard` broadcasts nothing: each rank keeps its own initialisation of its shard, so an unseeded
script would train a mix of WORLD_SIZE initialisations (lint rule DDP023). A helper in the style of
PyTorch's reproducibility notes (Python's `random`, numpy where the script imports it, torch and
every GPU) joins the other helpers once, and is called with seed 0 just before the first trained
model is built. Lint's fix for DDP023/DDP024 inserts the same helper.
"""

from __future__ import annotations

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import NUMPY, PYTHON, TORCH
from ddpify.anatomy.distributed.seeding import seeded_before
from ddpify.anatomy.syntax import spelling
from ddpify.codemods.base import Transform
from ddpify.codemods.options import Options
from ddpify.edits.seeding import SEED_CALL, SEED_HELPER, seed_helper

class SeedBeforeShard(Transform):
    """Seed every RNG before the first trained model is built, where torch is seeded nowhere before it."""

    NAME = "seed"
    SEES_EDITS_OF = ()

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        models = anatomy.trained_models
        return bool(models) and not seeded_before(anatomy, models[0].stmt, TORCH)

    def plan(self) -> None:
        model = self.anatomy.trained_models[0]
        if SEED_HELPER in self.anatomy.functions or not self.can_add_helpers():
            self.advise(model.line, "torch is never seeded before this model is built, and fully_shard keeps each rank's own "
                                    "initialisation of its shard: seed every RNG alike on every rank before it")
            return
        self.add_import(PYTHON)
        self.add_helper(SEED_HELPER, seed_helper(spelling(self.anatomy, TORCH) or TORCH, spelling(self.anatomy, NUMPY)))
        self.insert_before(model.stmt, SEED_CALL)
        self.changed(model.line, f"{SEED_HELPER}(0) before the model is built: fully_shard keeps each rank's own initialisation "
                                 "of its shard, so every rank must draw the same one")
