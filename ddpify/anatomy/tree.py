"""The parsed script, walked once: each node's parent, scope and statement, the functions and classes,
the names its imports bind, LibCST-style positions, and the blocks statements stand in.

`ScriptTree` is the first layer of an `Anatomy` (ddpify.anatomy.script); it knows nothing about PyTorch.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Iterator

from ddpify.anatomy.names import ImportTable
from ddpify.anatomy.sites import MODULE_SCOPE, Pos, Ref, Site

_BRANCHING = (ast.If, ast.Try, ast.TryStar, ast.With, ast.AsyncWith, ast.Match)  # a binding in their blocks is one after them
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_NESTED_CODE = (*_SCOPES, ast.Lambda)
# Operators and load/store contexts: leaves that ast.parse shares between nodes, so they have no
# parent, scope or statement of their own; the walk passes over them.
_SHARED_LEAVES = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)


@dataclass
class Function:
    """A function or method defined in the script, with the scope name its body runs in."""

    node: ast.FunctionDef | ast.AsyncFunctionDef
    scope: str
    cls: str | None
    locals: set[str]
    declared_global: set[str] = field(default_factory=set)  # its `global` statements' names

    @property
    def params(self) -> list[str]:
        args = self.node.args
        names = [a.arg for a in (*args.posonlyargs, *args.args)]
        return names[1:] if self.cls and names and names[0] in ("self", "cls") else names


class ScriptTree:
    """Where everything in one script stands, and what each name refers to."""

    def __init__(self, text: str, path: str, tree: ast.Module, pending_imports: dict[str, str] | None = None) -> None:
        self.text = text
        self.path = path
        self.tree = tree
        self.nodes: list[ast.AST] = []  # every node, in ast.walk's order: the whole-tree scans share one walk
        self.parents: dict[ast.AST, ast.AST] = {}
        self.scope_of: dict[ast.AST, str] = {}
        self.stmt_of: dict[ast.AST, ast.stmt] = {}
        self.functions: dict[str, Function] = {}
        self.class_of_scope: dict[str, str] = {}
        _Structure(self).walk()
        self.names = ImportTable(self.nodes, pending_imports)
        self._qualnames: dict[ast.AST, str | None] = {}  # rules and transforms ask it of the same nodes
        self._refs: dict[ast.AST, Ref | None] = {}
        self.main_guard: ast.If | None = None
        self.entry: str | None = None
        _find_entry(self)
        # Statements a plan ahead of a pending edit sees in place though they are not in the code yet
        # (ddpify.anatomy.distributed.wraps_made), each with the statement of the code it stands beside.
        self.stands_beside: dict[ast.stmt, ast.stmt] = {}

    wraps_made = False  # does this anatomy show the pending DDP wraps made (wraps_made.with_wraps_made)?

    def nodes_of(self, *classes: type[ast.AST]) -> list[ast.AST]:
        """The nodes of these ast classes (exactly: ast's node classes have no subclasses), in `nodes`'
        order: the scans for one kind of node skip the rest of the tree."""
        index = self._node_index
        if len(classes) == 1:
            return [self.nodes[i] for i in index.get(classes[0], ())]
        return [self.nodes[i] for i in sorted(i for cls in classes for i in index.get(cls, ()))]

    @cached_property
    def _node_index(self) -> dict[type, list[int]]:
        """The positions in `nodes` of each ast class's nodes."""
        index: dict[type, list[int]] = defaultdict(list)
        for i, node in enumerate(self.nodes):
            index[type(node)].append(i)
        return index

    # ----- positions -------------------------------------------------------------------------
    @cached_property
    def lines(self) -> list[str]:
        return _LINE_BREAK.split(self.text)

    def pos(self, node: ast.AST) -> Pos:
        """LibCST-style range of an ast node (character columns, not UTF-8 byte offsets)."""
        end_line = getattr(node, "end_lineno", node.lineno) or node.lineno
        end_col = getattr(node, "end_col_offset", node.col_offset) or 0
        return Pos(node.lineno, self._char_col(node.lineno, node.col_offset), end_line, self._char_col(end_line, end_col))

    def _char_col(self, line: int, byte_col: int) -> int:
        if self.text.isascii():
            return byte_col
        return len(self.lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", "ignore"))

    def site(self, node: ast.AST, cls: type[Site] = Site, **extra) -> Site:
        return cls(node=node, pos=self.pos(node), stmt=self.stmt_of.get(node, node), scope=self.scope_of.get(node, MODULE_SCOPE), **extra)

    # ----- names -----------------------------------------------------------------------------
    def qualname(self, expr: ast.AST) -> str | None:
        if expr not in self._qualnames:
            self._qualnames[expr] = self.names.qualname(expr)
        return self._qualnames[expr]

    def ref(self, expr: ast.AST, scope: str | None = None) -> Ref | None:
        """The variable an expression reads: `x` (local or global) or `self.x`; read in `scope`, or
        where it stands (remembered: every pass, rule and transform asks it of the same nodes)."""
        if scope is not None:
            return self._find_ref(expr, scope)
        if expr not in self._refs:
            self._refs[expr] = self._find_ref(expr, self.scope_of.get(expr, MODULE_SCOPE))
        return self._refs[expr]

    def _find_ref(self, expr: ast.AST, scope: str) -> Ref | None:
        if isinstance(expr, ast.Name):
            return Ref(self._binding_scope(expr.id, scope), expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
            cls = self.class_of_scope.get(scope)
            if cls:
                return Ref(cls, f"self.{expr.attr}")
        return None

    def _binding_scope(self, name: str, scope: str) -> str:
        """The function whose local `name` is, read in `scope`: that function, or the innermost
        enclosing one that binds it (a closure reads `model` of the function it is defined in;
        a class body in between binds nothing for it); else the module."""
        while scope != MODULE_SCOPE:
            fn = self.functions.get(scope)
            if fn is not None and name in fn.locals:
                return scope
            if fn is not None and name in fn.declared_global:
                return MODULE_SCOPE
            scope = scope.rpartition(".")[0] or MODULE_SCOPE
        return MODULE_SCOPE

    # ----- blocks and the statements around a node ------------------------------------------
    def block_of(self, stmt: ast.stmt) -> list[ast.stmt]:
        """The statement list that holds `stmt` (a body, an orelse, ...)."""
        parent, field_name, _ = self.place_of(stmt)
        return getattr(parent, field_name)

    def place_of(self, stmt: ast.stmt) -> tuple[ast.AST, str, int]:
        """Where `stmt` stands: its parent, the parent's field that holds its block (body, orelse,
        handlers' body, ...) and its index in that block."""
        parent = self.parents.get(stmt, self.tree)
        for field_name, block in ast.iter_fields(parent):
            if isinstance(block, list):
                for index, item in enumerate(block):
                    if item is stmt:
                        return parent, field_name, index
        raise ValueError(f"line {stmt.lineno}: statement not found in its parent")

    def enclosing(self, node: ast.AST, kinds: type | tuple[type, ...]) -> Iterator[ast.AST]:
        """Ancestors of `node` of the given node types, innermost first, within its function."""
        cur = self.parents.get(node)
        while cur is not None and not isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if isinstance(cur, kinds):
                yield cur
            cur = self.parents.get(cur)

    def _holds(self, stmt: ast.AST, node: ast.AST) -> bool:
        """Is `node` inside `stmt`?"""
        cur = self.parents.get(node)
        while cur is not None and cur is not stmt:
            cur = self.parents.get(cur)
        return cur is stmt

    def same_or_outer_block(self, stmt: ast.stmt, node: ast.AST) -> bool:
        """Is `stmt` in a block that `node` runs in too (not inside an `if` that `node` is outside)?"""
        block = self.block_of(stmt)
        cur: ast.AST | None = node
        while cur is not None:
            if cur in block:
                return True
            cur = self.parents.get(cur)
        return False

    def statement_binding(self, stmt: ast.stmt, used_at: ast.AST | None = None) -> ast.stmt | None:
        """The statement after which what `stmt` binds is bound: `stmt`, or the outermost if/try/with/match
        around it that stands in a block `used_at` runs in (None when none does, or one holds `used_at`).
        Without `used_at`, the outermost such statement of its function."""
        while used_at is None or not self.same_or_outer_block(stmt, used_at):
            around = self._branching_around(stmt)
            if around is None or (used_at is not None and self._holds(around, used_at)):
                return stmt if used_at is None else None
            stmt = around
        return stmt

    def _branching_around(self, stmt: ast.stmt) -> ast.stmt | None:
        """The if/try/with/match whose block (a branch, a handler, a case) holds `stmt`."""
        parent = self.parents.get(stmt)
        if isinstance(parent, (ast.excepthandler, ast.match_case)):
            parent = self.parents.get(parent)
        return parent if isinstance(parent, _BRANCHING) else None

    def runs_at_import(self, node: ast.AST) -> bool:
        """Is `node` module-level code outside the `if __name__ == "__main__":` block?"""
        if self.scope_of.get(node, MODULE_SCOPE) != MODULE_SCOPE:
            return False
        cur = self.parents.get(node)
        while cur is not None:
            if cur is self.main_guard:
                return False
            cur = self.parents.get(cur)
        return True


def walk_body(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node under the statements, not descending into nested functions or classes."""
    stack = list(reversed(list(body)))
    while stack:
        node = stack.pop()
        yield node
        stack += [child for child in child_nodes(node) if not isinstance(child, _NESTED_CODE)]


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """The node's children, as ast.iter_child_nodes gives them, less operators and contexts (a hot
    path: every analysis visits every node once)."""
    cls = type(node)
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        fields = _CHILD_FIELDS[cls] = _child_fields(cls)
    children = []
    for name in fields:
        value = getattr(node, name, None)
        if isinstance(value, list):
            children += [item for item in value if isinstance(item, ast.AST) and not isinstance(item, _SHARED_LEAVES)]
        elif isinstance(value, ast.AST) and not isinstance(value, _SHARED_LEAVES):
            children.append(value)
    return children


def _child_fields(cls: type) -> tuple[str, ...]:
    """The fields of an ast class that may hold children: all but the names, constants, operators and
    contexts of its grammar, which its docstring spells (`BinOp(expr left, operator op, expr right)`)."""
    signature = re.fullmatch(rf"{cls.__name__}\((.*)\)", (cls.__doc__ or "").partition("\n")[0].strip())
    if signature is None:
        return cls._fields  # type: ignore[attr-defined]
    kinds = {field.split()[-1]: field.split()[0].rstrip("*?") for field in signature.group(1).split(", ") if field}
    return tuple(name for name in cls._fields if kinds.get(name) not in _LEAF_KINDS)  # type: ignore[attr-defined]


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
_LEAF_KINDS = {"identifier", "string", "constant", "int", "expr_context", "boolop", "operator", "unaryop", "cmpop"}


class _Structure:
    """One walk of the tree, in ast.walk's order: every node, its parent, scope and statement, and
    the functions and classes with the names each function binds."""

    def __init__(self, anatomy: ScriptTree) -> None:
        self.a = anatomy
        self.declared_global: dict[str, set[str]] = defaultdict(set)  # function scope -> `global`/`nonlocal` names

    def walk(self) -> None:
        a = self.a
        nodes, parents, scope_of, stmt_of, functions = a.nodes, a.parents, a.scope_of, a.stmt_of, a.functions
        todo: deque[tuple[ast.AST, str, str | None, ast.stmt | None]] = deque([(a.tree, MODULE_SCOPE, None, None)])
        while todo:
            node, scope, cls, stmt = todo.popleft()
            nodes.append(node)
            fn = functions.get(scope)
            for child in child_nodes(node):
                if fn is not None:
                    self._bind(child, fn, scope)
                parents[child] = node
                child_stmt = child if isinstance(child, ast.stmt) else stmt
                scope_of[child] = scope
                if child_stmt is not None:
                    stmt_of[child] = child_stmt
                if isinstance(child, _SCOPES):
                    todo.append((child, *self._enter(child, scope, cls), child_stmt))
                else:
                    todo.append((child, scope, cls, child_stmt))
        for scope, names in self.declared_global.items():
            a.functions[scope].locals -= names

    def _bind(self, node: ast.AST, fn: Function, scope: str) -> None:
        """A name `node` binds in the function `fn` whose code it is in: an assignment target, a nested def or class."""
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                fn.locals.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.declared_global[scope].update(node.names)
            if isinstance(node, ast.Global):
                fn.declared_global.update(node.names)
        elif isinstance(node, _SCOPES):
            fn.locals.add(node.name)

    def _enter(self, node: ast.AST, scope: str, cls: str | None) -> tuple[str, str | None]:
        if isinstance(node, ast.ClassDef):
            name = node.name if scope == MODULE_SCOPE else f"{scope}.{node.name}"
            self.a.class_of_scope[name] = name
            return name, name
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_class = cls is not None and scope == cls
            name = node.name if scope == MODULE_SCOPE else f"{scope}.{node.name}"
            self.a.functions[name] = Function(node, name, cls if in_class else None, _parameters(node))
            if in_class:
                self.a.class_of_scope[name] = cls  # type: ignore[assignment]
            return name, cls if in_class else None
        return scope, cls


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = fn.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names.update(a.arg for a in (args.vararg, args.kwarg) if a)
    return names


def _find_entry(a: ScriptTree) -> None:
    """The `if __name__ == "__main__":` block and the local function it calls first."""
    for node in a.tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            a.main_guard = node
            for sub in walk_body(node.body):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in a.functions:
                    a.entry = sub.func.id
                    return
            return


def _is_main_test(test: ast.AST) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )
