"""Gradients averaged by hand for an optimizer that a model builds over its own parameters and steps itself.

A policy network that keeps `self.optimizer = optim.Adam(self.parameters(), ...)` and steps it in its
own `train_net()` has no variable a DDP wrapper could replace, and its forward passes call methods of
`self` (`self.pi(s)`, `self.v(s)`) that a wrapper would never see (ddpify.anatomy.owned_optimizers).
So the conversion does by hand what the wrapper would: `broadcast_parameters(self.optimizer)` once
the optimizer is built (every rank starts from rank 0's values) and `average_gradients(self.optimizer)`
after the last backward before each step (one all_reduce; a gradient clip after it sees averaged
gradients). The ranks then hold the same parameters after every step, as under DDP, whatever calls
the forward and however many backward passes a step sums. That the ranks make the same number of
steps is the environments transform's to ensure (the averaging is their collective). An optimizer
over a model the training step calls past its forward (`model.pi(s)`) is averaged alike, the model
left unwrapped (ddpify.anatomy.owned_optimizers); one whose optimizer is not bound to a variable
leaves the conversion incomplete, never a `.module` call that trains each rank apart.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy
from ddpify.anatomy.owned_optimizers import OwnedOptimizer, averaging_point, owned_optimizers, unaveraged_models_past_forward
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.evaluation import add_helpers
from ddpify.codemods.ddp.runtime import AVERAGE_CALL, BROADCAST_CALL
from ddpify.codemods.ddp.wrap import WrapModel
from ddpify.codemods.options import Options


class AveragedOwnedOptimizers(Transform):
    """Rank 0's parameters at the start and gradients averaged before each step, for each optimizer a class owns."""

    NAME = "average-gradients"
    SEES_EDITS_OF = ()  # its helpers go after setup's, there or pending (add_helpers)
    DUTY = WrapModel.DUTY  # the same duty: every trained model's gradients averaged over the ranks

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return bool(owned_optimizers(anatomy) or unaveraged_models_past_forward(anatomy))

    def plan(self) -> None:
        for model, call in unaveraged_models_past_forward(self.anatomy):
            self.missing(call.lineno, f"{model.target.name} is trained through {ast.unparse(call.func)}(...), past the forward a DDP "
                                      "wrapper syncs, and no optimizer bound to a variable was found over it to average by hand",
                         f"average its gradients by hand before each step ({AVERAGE_CALL}(optimizer)), or compute the loss "
                         "in forward and call the model")
        owned = owned_optimizers(self.anatomy)
        refused = [optimizer for optimizer in owned if not self._can_average(optimizer)]
        if refused:
            return
        if not add_helpers(self, {BROADCAST_CALL}):
            for optimizer in owned:
                self.missing(optimizer.built.line, f"{optimizer.why}, and this file has no distributed setup to put the "
                                                   "averaging helpers after",
                             f"average the gradients by hand before each step ({AVERAGE_CALL}(optimizer))")
            return
        for optimizer in owned:
            self._average(optimizer)
        self.fulfil()

    def _can_average(self, optimizer: OwnedOptimizer) -> bool:
        """Is every step of the optimizer found, and none given a closure (which computes the gradients inside the step)?"""
        name = optimizer.name
        if not optimizer.steps:
            self.missing(optimizer.built.line, f"{name} is built over its class's own parameters, but no {name}.step() "
                                               "was found, so its gradients are not averaged over the ranks",
                         f"average the gradients by hand before each step ({AVERAGE_CALL}(optimizer): an all_reduce "
                         "of every gradient, divided by the world size)")
        for step in (s for s in optimizer.steps if s.args or s.keywords):
            self.missing(step.lineno, f"{ast.unparse(step)} is given a closure, which computes the gradients inside the "
                                      "step, where no average can follow them",
                         "wrap the model in DistributedDataParallel and call it inside the closure")
        return bool(optimizer.steps) and not any(s.args or s.keywords for s in optimizer.steps)

    def _average(self, optimizer: OwnedOptimizer) -> None:
        name = optimizer.name
        self.insert_after(optimizer.built.stmt, f"{BROADCAST_CALL}({name})\n")
        self.changed(optimizer.built.line, f"{BROADCAST_CALL}({name}): every rank starts from rank 0's parameters ({optimizer.why})")
        for step in optimizer.steps:
            receiver = ast.unparse(step.func.value)  # type: ignore[attr-defined]
            self.insert_before(averaging_point(self.anatomy, step), f"{AVERAGE_CALL}({receiver})\n")
            self.changed(step.lineno, f"{AVERAGE_CALL}({receiver}) before {receiver}.step(): gradients averaged over "
                                      "the ranks (one all_reduce), as a DDP wrapper would")
