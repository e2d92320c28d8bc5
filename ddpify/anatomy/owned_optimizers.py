"""Optimizers a class builds over its own parameters and steps itself.

`self.optimizer = optim.Adam(self.parameters(), lr=lr)` in a policy network's `__init__`, stepped
by its own `train_net()` (minimalRL's REINFORCE, PPO, SAC): no variable outside the class holds the
model it trains, and the forward passes that feed its backward call methods of `self` (`self.pi(s)`,
`self.v(s)`) that no DistributedDataParallel wrapper would see. Such an optimizer is averaged by
hand instead: its parameters broadcast from rank 0 once it is built, and its gradients averaged over
the ranks (one all_reduce) between the backward passes and its step. That holds whatever calls the
forward, however many backward passes a step sums (REINFORCE backpropagates once per transition),
and at world size 1 it changes no number.

A model the training step calls through methods other than its forward (`prob = model.pi(s)`,
`model.v(s)` feeding the loss: minimalRL's A2C) is averaged the same way, its optimizer built in the
loop's own scope: a DDP wrapper all-reduces gradients only after a forward through the wrapper, so
`model.module.pi(s)` would leave each rank with its own gradients (no error, no average). The class
may be another file's (its methods cross as ReplicaFacts) or one no file of the project names (`from
models import *`, MUNIT's discriminators trained through `D1.compute_loss(x, gt)`): then any method an
nn.Module does not answer counts, as averaging by hand is right whatever the method runs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable

from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.scatter_gather import feeds_backward, model_replica_facts
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import CallSite, ModelSite, Ref
from ddpify.anatomy.syntax import method_name
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.vocabulary import FORWARD, MODULE_ATTRIBUTES

_STEP = "step"
_BACKWARD = "backward"


@dataclass(frozen=True)
class OwnedOptimizer:
    """An optimizer whose gradients no DDP wrapper would average: one a class keeps in `self.<attribute>`,
    built over what `self` holds, or one over a `model` the training step calls past its forward."""

    built: CallSite  # its construction
    name: str  # `self.optimizer` in its class's methods, `optimizer` where it is built
    steps: tuple[ast.Call, ...]  # `self.optimizer.step()` in the class, `model.optimizer.step()` elsewhere
    why: str  # why no wrapper reaches its model (the report's words)
    model: ModelSite | None = None  # the model trained past its forward (None: the class's own parameters)


@per_anatomy
def owned_optimizers(a: Anatomy) -> list[OwnedOptimizer]:
    """The optimizers whose gradients are averaged by hand: those a class builds over its own
    parameters and keeps, then those over a model the training step calls past its forward."""
    owned = []
    for site in a.optimizers_without_model:
        owner, attribute = a.class_of_scope.get(site.scope), _self_attribute(site)
        if owner and attribute and _reads_self(site.node):
            owned.append(OwnedOptimizer(site, f"self.{attribute}", tuple(_steps_of(a, owner, attribute)),
                                        f"self.{attribute} trains its own class's parameters, which no DDP wrapper can reach"))
    return owned + _optimizers_of_models_trained_past_forward(a)


def _optimizers_of_models_trained_past_forward(a: Anatomy) -> list[OwnedOptimizer]:
    """`optimizer = Adam(model.parameters())` (or `self.optimizer = ...`) where the step's loss comes from `model.pi(s)`."""
    found = []
    for model, call in _models_trained_past_forward(a):
        for site, target in _optimizers_over(a, model):
            why = f"{model.target.name} is trained through {ast.unparse(call.func)}(...), past the forward a DDP wrapper syncs"
            found.append(OwnedOptimizer(site, ast.unparse(target), tuple(_steps_through(a, a.ref(target))), why, model))
    return found


def unaveraged_models_past_forward(a: Anatomy) -> list[tuple[ModelSite, ast.Call]]:
    """The models trained past their forward that no optimizer bound to a variable trains: nothing to average by hand."""
    return [(model, call) for model, call in _models_trained_past_forward(a) if not _optimizers_over(a, model)]


def _optimizers_over(a: Anatomy, model: ModelSite) -> list[tuple[CallSite, ast.expr]]:
    """The optimizers built over `model` and bound to a variable, with that variable."""
    return [(site, target) for site in a.optimizers if (target := _bound_variable(site)) is not None
            and any(a.ref(n) == model.target for n in a.walk_through_variables(site.node) if isinstance(n, (ast.Name, ast.Attribute)))]


@per_anatomy
def _models_trained_past_forward(a: Anatomy) -> list[tuple[ModelSite, ast.Call]]:
    """Each trained model of a class of this file or of another file of the project, with the first call
    of one of its methods past forward whose result the training step back-propagates."""
    found = []
    builds_optimizer = {id(site.node) for site in a.optimizers}  # `model.configure_optimizers(config)` returns no loss
    for model in a.trained_models:
        past_forward = _runs_past_forward(a, model.class_name)
        for call in (c.node for c in a.calls):
            if (past_forward(method_name(call)) and a.ref(call.func.value) == model.target  # type: ignore[attr-defined]
                    and id(call) not in builds_optimizer and feeds_backward(a, call)):
                found.append((model, call))
                break
    return found


def _runs_past_forward(a: Anatomy, class_name: str) -> Callable[[str | None], bool]:
    """Does a method of a model class run it past forward: one the class defines other than forward and
    those that only call it (`compute_loss` that runs `self(x)` and returns a loss), or, for a class no file
    of the project defines (`from models import *`, a library's), any method an nn.Module does not answer?"""
    facts = model_replica_facts(a, class_name)
    if facts is None:
        return lambda method: method is not None and method not in MODULE_ATTRIBUTES
    return facts.methods.difference(facts.forward_aliases, {FORWARD}).__contains__


def _bound_variable(site: CallSite) -> ast.expr | None:
    """`optimizer` in `optimizer = Adam(...)`, `self.optimizer` in `self.optimizer = Adam(...)`."""
    stmt = site.stmt
    if isinstance(stmt, ast.Assign) and stmt.value is site.node and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0]
    return stmt.targets[0] if _self_attribute(site) else None  # type: ignore[attr-defined]


def _steps_through(a: Anatomy, optimizer: Ref | None) -> list[ast.Call]:
    """`optimizer.step()` where `optimizer` is that variable."""
    return [site.node for site in a.training_calls  # type: ignore[misc]
            if method_name(site.node) == _STEP and a.ref(site.node.func.value) == optimizer]  # type: ignore[attr-defined]


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
