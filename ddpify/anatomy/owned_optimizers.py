"""Optimizers a class builds over its own parameters and steps itself.

`self.optimizer = optim.Adam(self.parameters(), lr=lr)` in a policy network's `__init__`, stepped
by its own `train_net()` (minimalRL's REINFORCE, PPO, SAC): no variable outside the class holds the
model it trains, and the forward passes that feed its backward call methods of `self` (`self.pi(s)`,
`self.v(s)`) that no DistributedDataParallel wrapper would see. Such an optimizer is averaged by
hand instead: its parameters broadcast from rank 0 once it is built, and its gradients averaged over
the ranks (one all_reduce) between the backward passes and its step. That holds whatever calls the
forward, however many backward passes a step sums (REINFORCE backpropagates once per transition),
and at world size 1 it changes no number.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import CallSite
from ddpify.anatomy.syntax import method_name
from ddpify.anatomy.tree import walk_body

_STEP = "step"
_BACKWARD = "backward"


@dataclass(frozen=True)
class OwnedOptimizer:
    """An optimizer a class keeps in `self.<attribute>`, built over what `self` holds."""

    built: CallSite  # its construction, in a method of `owner`
    owner: str  # the class
    attribute: str  # `optimizer` for `self.optimizer`
    steps: tuple[ast.Call, ...]  # `self.optimizer.step()` in the class, `model.optimizer.step()` elsewhere


def owned_optimizers(a: Anatomy) -> list[OwnedOptimizer]:
    """The optimizers without a model to wrap that a class builds over its own parameters and keeps."""
    owned = []
    for site in a.optimizers_without_model:
        owner, attribute = a.class_of_scope.get(site.scope), _self_attribute(site)
        if owner and attribute and _reads_self(site.node):
            owned.append(OwnedOptimizer(site, owner, attribute, tuple(_steps_of(a, owner, attribute))))
    return owned


def averaging_point(a: Anatomy, step: ast.Call) -> ast.stmt:
    """The statement before which the gradients are averaged: the first after the last backward that
    precedes the step in its block (a gradient clip in between then sees averaged gradients, as under
    DDP), else the step's own."""
    stmt = a.stmt_of[step]
    block = a.block_of(stmt)
    index = block.index(stmt)
    last_backward = next((i for i in range(index - 1, -1, -1) if _has_backward(block[i])), None)
    return block[last_backward + 1] if last_backward is not None else stmt


def _self_attribute(site: CallSite) -> str | None:
    """`optimizer` where the construction is the whole value of `self.optimizer = ...`."""
    stmt = site.stmt
    if not (isinstance(stmt, ast.Assign) and stmt.value is site.node and len(stmt.targets) == 1):
        return None
    target = stmt.targets[0]
    is_self = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    return target.attr if is_self else None  # type: ignore[union-attr]


def _reads_self(call: ast.AST) -> bool:
    """Is the optimizer built over what `self` holds (`self.parameters()`, `[self.log_alpha]`)?"""
    return any(isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(call))


def _steps_of(a: Anatomy, owner: str, attribute: str) -> list[ast.Call]:
    """`X.<attribute>.step(...)`: through `self` in a method of `owner`, or through any other object."""
    found = []
    for site in a.training_calls:
        receiver = site.node.func.value if method_name(site.node) == _STEP else None  # type: ignore[attr-defined]
        if not (isinstance(receiver, ast.Attribute) and receiver.attr == attribute):
            continue
        through_self = isinstance(receiver.value, ast.Name) and receiver.value.id == "self"
        if not through_self or a.class_of_scope.get(site.scope) == owner:
            found.append(site.node)
    return found


def _has_backward(stmt: ast.stmt) -> bool:
    return any(method_name(n) == _BACKWARD for n in walk_body([stmt]))
