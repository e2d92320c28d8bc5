"""Syntax helpers that know nothing about PyTorch: arguments, literals, names, enclosing nodes."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Callable, Iterator

from ddpify.anatomy.sites import MODULE_SCOPE

if TYPE_CHECKING:
    from ddpify.anatomy.tree import ScriptTree


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((kw for kw in call.keywords if kw.arg == name), None)


def argument(call: ast.Call, index: int, name: str) -> ast.AST | None:
    """The argument passed by keyword `name` or at position `index`."""
    kw = keyword(call, name)
    if kw is not None:
        return kw.value
    return call.args[index] if index < len(call.args) and not isinstance(call.args[index], ast.Starred) else None


def constant(expr: ast.AST | None, *values: object) -> bool:
    """Is `expr` a literal equal to one of `values` (True is not 1 here)?"""
    return isinstance(expr, ast.Constant) and any(type(expr.value) is type(v) and expr.value == v for v in values)


def method_name(call: ast.AST) -> str | None:
    """`step` for `x.step(...)`."""
    return call.func.attr if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) else None


def identifier(expr: ast.AST) -> str | None:
    """The last name of `x`, `self.x`, `args.x`."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def spelling(a: ScriptTree, qualified: str) -> str | None:
    """How this file spells `qualified` through its imports (`dist.barrier`), or None if it can't."""
    best: tuple[int, str] | None = None
    for local, target in a.names.aliases.items():
        if qualified == target or qualified.startswith(target + "."):
            candidate = local + qualified[len(target):]
            if best is None or len(target) > best[0]:
                best = (len(target), candidate)
    return best[1] if best else None


def ancestors(a: ScriptTree, node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(parent, child-on-the-path) pairs from `node` up to the module."""
    child, parent = node, a.parents.get(node)
    while parent is not None:
        yield parent, child
        child, parent = parent, a.parents.get(parent)


def enclosing_function(a: ScriptTree, node: ast.AST) -> str:
    """The scope name of the function (or the module) whose body holds `node`."""
    scope = a.scope_of.get(node, MODULE_SCOPE)
    while scope != MODULE_SCOPE and scope not in a.functions:
        scope = scope.rpartition(".")[0] or MODULE_SCOPE
    return scope


def contains(expr: ast.AST, predicate: Callable[[ast.AST], bool]) -> bool:
    return any(predicate(n) for n in ast.walk(expr))
