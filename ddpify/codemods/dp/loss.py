"""Transform 3: a loss returned by `forward` is averaged where the training code takes it out.

Each replica returns its own scalar loss and DataParallel gathers them into a vector with one
loss per GPU: `loss.backward()` fails on it and `loss.item()` too. Averaging right where the loss
comes out of the model (`model(x, y).mean()`, `out["loss"].mean()`, or `loss = loss.mean()` after
`loss, logits = model(x, y)`) fixes every later use at once: backward, logging, accumulation.
A model whose class another file defines counts as returning a loss where its output is
back-propagated whole (`loss = model(x0)`, `loss.backward()`: a diffusion model's MSE).
"""

from __future__ import annotations

import ast

from ddpify.anatomy.forward_losses import LossAccess, is_reduced, model_losses, reads_after
from ddpify.codemods.base import Transform
from ddpify.edits.expressions import mean_of

_WHY = "DataParallel returns one loss per GPU"


class MeanLoss(Transform):
    """A loss that forward() returns comes back once per GPU: average it with .mean()."""

    NAME = "loss"
    SEES_EDITS_OF = ()  # model calls and forward()s are the user's code

    def plan(self) -> None:
        for _, access in model_losses(self.anatomy):
            self._average(access)

    def _average(self, access: LossAccess) -> None:
        node = access.node
        if access.unpacked:
            reads = reads_after(self.anatomy, access.stmt, node)  # type: ignore[arg-type]
            if reads and not is_reduced(self.anatomy, reads[0]):
                self.insert_after(access.stmt, f"{node.id} = {node.id}.mean()  # {_WHY}\n")  # type: ignore[attr-defined]
                self.changed(access.stmt.lineno, f"{node.id} = {node.id}.mean(): {_WHY}")  # type: ignore[attr-defined]
        elif not is_reduced(self.anatomy, node):
            self.rewrite_expression(node, mean_of)  # type: ignore[arg-type]
            self.changed(node.lineno, f"{ast.unparse(node)}.mean(): {_WHY}")

