"""Every value a script binds to each variable, indexed once per anatomy.

The analysis follows a model through assignments, the DDP facts find the value that reaches a use,
and the DataParallel facts follow a device or a literal to where it was written: all three read
this one index, each taking the bindings it can use.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.sites import Ref

if TYPE_CHECKING:
    from ddpify.anatomy.tree import ScriptTree


@dataclass(frozen=True)
class Binding:
    """`stmt` gives the variable `value`: the whole right-hand side (`whole`), one item of a tuple
    unpacked from a tuple (`a, b = x, y`), or None where no expression says what it gets (`a, b = f()`,
    `n += 1`, a loop variable, `x: int`)."""

    stmt: ast.stmt
    value: ast.AST | None
    whole: bool

    @property
    def assigned(self) -> bool:
        """An `=` assignment with a known value (not `+=`, not a loop)."""
        return isinstance(self.stmt, (ast.Assign, ast.AnnAssign)) and self.value is not None


@per_anatomy
def bindings(a: ScriptTree) -> dict[Ref, list[Binding]]:
    """Each variable's bindings by assignment, augmented assignment and `for`, in source order."""
    found: dict[Ref, list[Binding]] = defaultdict(list)
    for node in a.nodes_of(ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor):
        for target, binding in _bindings_of(node):
            for ref in _refs_bound(a, target):
                found[ref].append(binding)
    for entries in found.values():
        entries.sort(key=lambda b: (b.stmt.lineno, b.stmt.col_offset))
    return found


def _bindings_of(node: ast.AST) -> Iterator[tuple[ast.AST, Binding]]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _unpacked(node, target, node.value)
    elif isinstance(node, ast.AnnAssign):
        yield node.target, Binding(node, node.value, whole=True)
    elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor)):
        yield node.target, Binding(node, None, whole=False)


def _unpacked(stmt: ast.Assign, target: ast.AST, value: ast.AST) -> Iterator[tuple[ast.AST, Binding]]:
    """`x = v`: x gets v; `a, b = x, y`: a gets x and b gets y; anything else binds names to no known value."""
    if isinstance(target, (ast.Name, ast.Attribute)):
        yield target, Binding(stmt, value, whole=True)
    elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        for item, item_value in zip(target.elts, value.elts):
            known = isinstance(item, (ast.Name, ast.Attribute))
            yield item, Binding(stmt, item_value if known else None, whole=False)
    else:
        yield target, Binding(stmt, None, whole=False)


def _refs_bound(a: ScriptTree, target: ast.AST) -> Iterator[Ref]:
    """The variables a binding target stores into (`x`, `self.x`, the names inside `(a, (b, c))`)."""
    for node in [target] if isinstance(target, (ast.Name, ast.Attribute)) else ast.walk(target):  # the usual case first
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            ref = a.ref(node)
            if ref is not None:
                yield ref

