"""Assignments and the value that reaches a use: which assignment a read sees, a function's callers and
returned values, and whether a dataset is iterable. The value flow every other question follows.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from typing import Iterator

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, Ref
from ddpify.anatomy.syntax import ancestors, argument, enclosing_function
from ddpify.anatomy.vocabulary import ITERABLE_DATASETS

MAX_DEPTH = 12


@per_anatomy
def assignments(a: Anatomy) -> dict[Ref, list[tuple[ast.stmt, ast.AST]]]:
    """Every `ref = value` (and `a, b = x, y`), in source order."""
    return {ref: [(b.stmt, b.value) for b in found if b.assigned] for ref, found in bindings(a).items()}  # type: ignore[misc]


def reaching_values(a: Anatomy, expr: ast.AST) -> list[ast.AST]:
    """The values that may reach this read of a variable.

    Within one function, the last assignment before the read; a parameter with no assignment
    before the read is every caller's argument; `self.x` read in another method (or a global read
    in a function) may hold any value assigned to it.
    """
    ref = a.ref(expr)
    if ref is None:
        return []
    use_scope = a.scope_of.get(expr, MODULE_SCOPE)
    here = a.stmt_of.get(expr)
    entries = [(s, v) for s, v in assignments(a).get(ref, ()) if s is not here]
    same_scope = [(s, v) for s, v in entries if a.scope_of.get(s, MODULE_SCOPE) == use_scope]
    before = [v for s, v in same_scope if s.lineno <= expr.lineno and not in_other_branch(a, s, expr)]
    if before:
        return [before[-1]]
    fn = a.functions.get(use_scope)
    if ref.scope == use_scope and fn is not None and ref.name in fn.params:
        index = fn.params.index(ref.name)
        return [arg for call in callers(a, use_scope) if (arg := argument(call, index, ref.name)) is not None]
    if ref.scope != use_scope:
        others = [v for s, v in entries if a.scope_of.get(s, MODULE_SCOPE) != use_scope and not only_called_before(a, use_scope, s)]
        return others or [v for _, v in same_scope]
    return []


def in_other_branch(a: Anatomy, stmt: ast.stmt, node: ast.AST) -> bool:
    """Do `stmt` and `node` sit in different branches of one `if` (`if distributed: model = DDP(model)`
    / `else: model.features`), so that one never runs after the other?"""
    branches = dict(_branches(a, stmt))
    return any(branches.get(test, branch) != branch for test, branch in _branches(a, node))


def _branches(a: Anatomy, node: ast.AST) -> Iterator[tuple[int, str]]:
    """(the `if`, "body" or "orelse") for each `if` whose branch holds `node`."""
    for parent, child in ancestors(a, node):
        if isinstance(parent, ast.If) and child is not parent.test:
            yield id(parent), "body" if a.stands_beside.get(child, child) in parent.body else "orelse"


def is_iterable_dataset(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """Does `expr` hold an IterableDataset (no sampler can shard it: it yields its own samples)?"""
    if depth > MAX_DEPTH:
        return False
    if isinstance(expr, ast.NamedExpr):
        return is_iterable_dataset(a, expr.value, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return any(is_iterable_dataset(a, v, depth + 1) for v in reaching_values(a, expr))
    return isinstance(expr, ast.Call) and _derives_from_iterable_dataset(a, a.qualname(expr.func) or "", frozenset())


def _derives_from_iterable_dataset(a: Anatomy, name: str, seen: frozenset[str]) -> bool:
    if name in ITERABLE_DATASETS:
        return True
    cls = next((n for n in a.tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None or name in seen:
        return False
    return any(_derives_from_iterable_dataset(a, a.qualname(base) or "", seen | {name}) for base in cls.bases)


def only_called_before(a: Anatomy, scope: str, stmt: ast.stmt) -> bool:
    """Is function `scope` called only from `stmt`'s function, before `stmt` (so `stmt` can't reach it)?"""
    calls = callers(a, scope)
    stmt_scope = a.scope_of.get(stmt, MODULE_SCOPE)
    return bool(calls) and all(a.scope_of.get(c) == stmt_scope and c.lineno < stmt.lineno for c in calls)


@per_anatomy
def callers_by_scope(a: Anatomy) -> dict[str, list[ast.Call]]:
    """Local functions and methods, each with the calls that invoke it.

    Besides `Anatomy.callee` (plain names and `self.method()`), `obj.method()` counts as a call of
    every method of that name that a class of this file defines (`trainer.fit()`).
    """
    methods: dict[str, list[str]] = defaultdict(list)
    for scope, fn in a.functions.items():
        if fn.cls is not None:
            methods[fn.node.name].append(scope)
    found: dict[str, list[ast.Call]] = defaultdict(list)
    for site in a.calls:
        call: ast.Call = site.node  # type: ignore[assignment]
        callee = a.callee(call)
        if callee is not None:
            found[callee].append(call)
        elif isinstance(call.func, ast.Attribute) and not _is_self(call.func.value):
            for scope in methods.get(call.func.attr, ()):
                found[scope].append(call)
    return found


def callers(a: Anatomy, scope: str) -> list[ast.Call]:
    return callers_by_scope(a).get(scope, [])


def calls_running(a: Anatomy, scope: str) -> list[ast.Call]:
    """Every call that runs function `scope`: its callers, their callers, and so on."""
    found: list[ast.Call] = []
    seen, todo = set(), [scope]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for call in callers(a, current):
            found.append(call)
            todo.append(enclosing_function(a, call))
    return found


def _is_self(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


def returned_values(a: Anatomy, scope: str) -> list[ast.AST]:
    fn = a.functions.get(scope)
    if fn is None:
        return []
    return [n.value for n in _walk_function(fn.node) if isinstance(n, ast.Return) and n.value is not None]


def _walk_function(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body, not descending into nested functions or classes."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
