"""Tensors trained by hand average their gradients over the ranks after each backward.

With no module to wrap (weights in bare tensors, `w -= learning_rate * w.grad` under no_grad), the
wrap's duty is done by hand: `average_tensor_gradients(w1, w2)` right after every `loss.backward()`, one
all_reduce per tensor, exactly what DDP does for a model's parameters before the update; and
`broadcast_tensors(w1, w2)` before the loop that trains them, so the ranks start from rank 0's values
as a DDP wrap starts a model's parameters (an unseeded `torch.randn` draws other values on each rank).
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy
from ddpify.anatomy.hand_updates import hand_trained_tensors
from ddpify.anatomy.sites import CallSite
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.evaluation import add_helpers
from ddpify.codemods.ddp.runtime import TENSORS_BROADCAST_CALL, TENSORS_CALL
from ddpify.codemods.ddp.wrap import WrapModel
from ddpify.codemods.options import Options


class HandAveragedGradients(Transform):
    """Average the gradients of tensors updated by hand over the ranks, where there is no model to wrap."""

    NAME = "gradients"
    SEES_EDITS_OF = ()  # its helper goes after setup's, there or pending (add_helpers)
    DUTY = WrapModel.DUTY  # the same duty: the ranks' gradients are averaged before each update

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return any(hand_trained_tensors(anatomy, site.scope) for site in _backwards(anatomy))

    def plan(self) -> None:
        backwards = [(site, tensors) for site in _backwards(self.anatomy) if (tensors := hand_trained_tensors(self.anatomy, site.scope))]
        if not add_helpers(self, {TENSORS_CALL}):
            return
        for site, tensors in backwards:
            self.insert_after(site.stmt, f"{TENSORS_CALL}({', '.join(tensors)})\n")
            self.changed(site.line, f"{TENSORS_CALL}({', '.join(tensors)}) after backward: no model to wrap in DistributedDataParallel "
                                    "(tensors updated by hand from their gradients), so the ranks average those gradients as DDP would")
        for loop, tensors in _training_loops(self.anatomy, backwards).items():
            self.insert_before(loop, f"{TENSORS_BROADCAST_CALL}({', '.join(tensors)})\n")
            self.changed(loop.lineno, f"{TENSORS_BROADCAST_CALL}({', '.join(tensors)}) before training: every rank starts from rank 0's "
                                      "values, as a DDP wrap starts a model's parameters")
        self.fulfil()


def _backwards(a: Anatomy) -> list[CallSite]:
    """The training's `loss.backward()` calls."""
    return [site for site in a.training_calls if isinstance(site.node.func, ast.Attribute) and site.node.func.attr == "backward"]  # type: ignore[attr-defined]


def _training_loops(a: Anatomy, backwards: list[tuple[CallSite, list[str]]]) -> dict[ast.stmt, list[str]]:
    """The outermost loop around each backward in its function, and the tensors it trains."""
    loops: dict[ast.stmt, list[str]] = {}
    for site, tensors in backwards:
        outer = list(a.enclosing(site.node, (ast.For, ast.While)))
        if outer:
            trained = loops.setdefault(outer[-1], [])  # type: ignore[arg-type]
            trained.extend(t for t in tensors if t not in trained)
    return loops
