"""A backward whose gradients of a wrapped model are cleared unused skips their all-reduce with `model.no_sync()`.

A GAN's generator step back-propagates through the discriminator (`lossG = criterion(netD(fake),
ones); lossG.backward()`), and the next pass clears netD's gradients (`optimizerD.zero_grad()`)
before anything uses them. Under DDP that backward all-reduces them anyway; the statements from
netD's forward through that backward run under `netD.no_sync()` instead, and the ranks keep those
gradients local: one all-reduce a step less, every number the script uses the same. Which runs
qualify, and why it is safe, is ddpify.anatomy.discarded_gradients's to say.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy
from ddpify.anatomy.discarded_gradients import discarded_syncs
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.no_sync import run_under
from ddpify.codemods.options import Options


class NoSyncDiscardedGradients(Transform):
    """Skip the all-reduce of a wrapped model's gradients that are cleared before any use, with model.no_sync()."""

    NAME = "no_sync_discarded"
    SEES_EDITS_OF = ()

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return bool(discarded_syncs(anatomy))

    def plan(self) -> None:
        for run in discarded_syncs(self.anatomy):
            model, clearing = run.model.target.name, ast.unparse(run.cleared_by)
            why = f"{clearing} clears {model}'s gradients from this backward unused: no_sync() saves their all-reduce, one a step"
            run_under(self, run.statements, f"{model}.no_sync()", ("no_sync_discarded", model, run.statements[0].lineno), why)
            self.changed(run.statements[0].lineno, f"{model}'s forward through backward run under {model}.no_sync(): the "
                                                   f"gradients of {model} it all-reduced are cleared by {clearing} before any use")
