"""Seed every RNG alike on every rank before the first trained model is built.

A helper in the style of PyTorch's reproducibility notes (Python's `random`, numpy where the script
imports it, torch and every GPU) joins the other helpers once, or follows the imports where no
transform left room for helpers, and is called with seed 0 just before the first trained model is
built: the same helper lint's fix for DDP023/DDP024 inserts (ddpify.edits.seeding). Each target
says when its script needs it (`finds_work`) and why (`WHY`).

A script that asks for runs that repeat (a `--seed` option nothing reads, `cudnn.deterministic = True`)
and seeds torch nowhere gets it on every target whose output lint judges (DDP024, a warning that any
multi-GPU script with that text earns, whoever wrote it): seeding is what the script asked for, and
costs nothing it had, since an unseeded script draws other numbers at every run anyway.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import NUMPY, PYTHON, TORCH
from ddpify.anatomy.distributed.seeding import looks_after_reproducibility, seeded_anywhere
from ddpify.anatomy.syntax import spelling
from ddpify.codemods.base import Transform
from ddpify.codemods.options import Options
from ddpify.edits.positions import last_leading_import
from ddpify.edits.seeding import SEED_CALL, SEED_HELPER, seed_helper


class SeedEveryRng(Transform):
    """`seed_everything(0)` before the first trained model is built, the helper defined once."""

    NAME = "seed"
    SEES_EDITS_OF: tuple[str, ...] = ()
    WHY = ""  # why the script needs the seed (the report's words)

    def plan(self) -> None:
        model = self.anatomy.trained_models[0]
        self.seed_before(model.stmt, model.line, "the model is built")

    def seed_before(self, stmt: ast.stmt, line: int, what: str) -> None:
        """`seed_everything(0)` before `stmt` (`what` it does, for the report), or advice where there is no room."""
        if SEED_HELPER in self.anatomy.functions or not self._define_helper(stmt.lineno):
            self.advise(line, f"seed every RNG alike on every rank before {what}: {self.WHY}")
            return
        self.insert_before(stmt, SEED_CALL)
        self.changed(line, f"{SEED_HELPER}(0) before {what}: {self.WHY}")

    def _define_helper(self, before_line: int) -> bool:
        """The helper among the others, or after the imports where no room was left for helpers
        (False where the model is built among the imports)."""
        helper = seed_helper(spelling(self.anatomy, TORCH) or TORCH, spelling(self.anatomy, NUMPY))
        if self.can_add_helpers():
            self.add_import(PYTHON)
            self.add_helper(SEED_HELPER, helper)
            return True
        anchor = last_leading_import(self.anatomy.tree)
        if anchor is None or anchor.end_lineno >= before_line:  # type: ignore[operator]
            return False
        self.add_import(PYTHON)
        self.insert_after(anchor, helper)
        return True


class SeedWhereAskedFor(SeedEveryRng):
    """`seed_everything(0)` before the model, where the script shows care for reproducibility and seeds torch nowhere."""

    WHY = "the script asks for runs that repeat (a seed option, a deterministic switch, a seed of another RNG) and seeds torch nowhere"

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return bool(anatomy.trained_models) and looks_after_reproducibility(anatomy) and not seeded_anywhere(anatomy, TORCH)
