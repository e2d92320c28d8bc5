"""Samplers: the `DistributedSampler` (or rank-sharding function) a DataLoader draws from, whether it
shuffles, the variable it is bound to, and `set_epoch` calls.
"""

from __future__ import annotations

import ast
from typing import Iterable

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.distributed.names import DISTRIBUTED_SAMPLER
from ddpify.anatomy.distributed.ranks import mentions_rank
from ddpify.anatomy.distributed.reaching import MAX_DEPTH, assignments, reaching_values, returned_values
from ddpify.anatomy.sites import LoaderSite
from ddpify.anatomy.syntax import argument, constant, keyword, method_name

RANDOM_SAMPLERS = frozenset({"torch.utils.data.RandomSampler", "torch.utils.data.sampler.RandomSampler"})


def loader_sampler(a: Anatomy, loader: LoaderSite) -> ast.Call | None:
    """The call that shards a DataLoader across ranks: the `DistributedSampler(...)` its
    `sampler=`/`batch_sampler=` holds, or a local function returning this rank's indices."""
    for name in ("sampler", "batch_sampler"):
        kw = keyword(loader.call, name)
        if kw is not None:
            return _distributed_sampler_in(a, kw.value, 0)
    return None


def _distributed_sampler_in(a: Anatomy, expr: ast.AST, depth: int) -> ast.Call | None:
    if depth > MAX_DEPTH:
        return None
    if isinstance(expr, ast.Call):
        if a.qualname(expr.func) == DISTRIBUTED_SAMPLER or _returns_rank_shard(a, expr):
            return expr
        inner = [_distributed_sampler_in(a, arg, depth + 1) for arg in (*expr.args, *(k.value for k in expr.keywords))]
        return next((s for s in inner if s is not None), None)  # BatchSampler(DistributedSampler(...), ...)
    if isinstance(expr, ast.IfExp):
        return _distributed_sampler_in(a, expr.body, depth + 1) or _distributed_sampler_in(a, expr.orelse, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        ref = a.ref(expr)
        for _, value in assignments(a).get(ref, ()) if ref else ():
            found = _distributed_sampler_in(a, value, depth + 1)
            if found is not None:
                return found
    return None


def _returns_rank_shard(a: Anatomy, call: ast.Call) -> bool:
    """A call of a local function whose result depends on the rank (ddpify's `evaluation_shard`)."""
    callee = a.callee(call)
    return callee is not None and any(mentions_rank(a, value) for value in returned_values(a, callee))


def sampler_with_replacement(a: Anatomy, expr: ast.AST) -> ast.Call | None:
    """The `RandomSampler(dataset, replacement=True, ...)` a loader's `sampler=` holds (built there, or
    in the one assignment that reaches it), drawing from torch's global RNG (no generator of its own)."""
    values = [expr] if isinstance(expr, ast.Call) else reaching_values(a, expr)
    call = values[0] if len(values) == 1 else None
    if not isinstance(call, ast.Call) or a.qualname(call.func) not in RANDOM_SAMPLERS:
        return None
    replaces = constant(argument(call, 1, "replacement"), True)
    return call if replaces and argument(call, 3, "generator") is None else None


def sampler_shuffles(call: ast.Call) -> bool:
    return not constant(argument(call, 3, "shuffle"), False)


def has_sampler_argument(loader: LoaderSite) -> bool:
    return any(
        kw.arg in ("sampler", "batch_sampler") and not constant(kw.value, None) for kw in loader.call.keywords
    ) or len(loader.call.args) > 3


def bound_name(a: Anatomy, value: ast.AST) -> ast.AST | None:
    """The variable (`sampler`, `self.sampler`) an assignment binds `value` (or an IfExp holding it) to."""
    node = value
    while isinstance(a.parents.get(node), ast.IfExp):
        node = a.parents[node]
    stmt = a.parents.get(node)
    if isinstance(stmt, ast.Assign) and stmt.value is node and len(stmt.targets) == 1:
        return stmt.targets[0]
    if isinstance(stmt, ast.AnnAssign) and stmt.value is node:
        return stmt.target
    return None


def sets_epoch(a: Anatomy, body: Iterable[ast.AST]) -> bool:
    """Does this code (or a function it calls) call `<something>.set_epoch(...)`?"""
    return a.body_contains(body, lambda n: method_name(n) == "set_epoch")


def restarted_passes(a: Anatomy, loader: LoaderSite) -> list[ast.Call]:
    """The `iter(loader)` calls that a training loop makes anew each time the last pass ends (a step loop
    over `next(it)`, re-created at StopIteration): each starts the sampler's next epoch. Only those whose
    loader is named (`iter(loader)`, `iter(self.loader)`), so that its sampler can be reached there."""
    return [call for call, iterated, loop in a.iterator_passes
            if iterated is loader and loop is not None and isinstance(call.args[0], (ast.Name, ast.Attribute))]


def epochs_numbered_here(a: Anatomy, loader: LoaderSite) -> bool:
    """Does this file tell the loader's sampler its epochs: an epoch loop around it, or passes restarted inside the training loop?"""
    return bool(a.epoch_loops_around(loader) or restarted_passes(a, loader))
