"""Transform: every rank draws the same `random_split`.

Each rank runs the split; unseeded, each draws its own, and one rank's validation samples become
another's training samples. A `random_split` with no generator and no seed before it gets
`generator=torch.Generator().manual_seed(0)` (lint rule DDP011 finds the same calls).
"""

from __future__ import annotations

import libcst as cst

from ddpify.anatomy import syntax
from ddpify.anatomy.distributed.randomness import unseeded_random_splits
from ddpify.codemods.base import Transform
from ddpify.edits.expressions import SEEDED_GENERATOR, with_seeded_generator

class SameSplitOnEveryRank(Transform):
    """Give random_split a seeded generator, so that every rank draws the same split."""

    NAME = "split"
    SEES_EDITS_OF = ()

    def plan(self) -> None:
        splits = unseeded_random_splits(self.anatomy)
        if not splits:
            return
        torch = syntax.spelling(self.anatomy, "torch")
        if torch is None:
            self.add_import("torch")
        torch = torch or "torch"
        for site in splits:
            self.rewrite_node(site.node, cst.Call, lambda call: with_seeded_generator(call, torch))  # type: ignore[arg-type]
            self.changed(site.line, f"random_split(..., generator={torch}.{SEEDED_GENERATOR}): every rank draws the same split")
