"""Fix edits built by the convert transforms' own LibCST machinery, serialised as text `Edit`s.

A structural fix finds the CST node at an ast node's position in a LibCST parse of the script,
applies the builder the codemods use (`guard`, `first_in_body`, `add_keyword`, `module_of`, ...)
and renders the result with the module's own indentation and line endings. LibCST re-indents
statements and leaves string contents alone, so multi-line strings, tabs and CRLF files come out
right. A statement that shares its line (`a; b`, `if x: a`) is first spread one statement a line.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpify.anatomy import Anatomy
from ddpify.anatomy.cache import per_anatomy
from ddpify.codemods.base import Key, Span, StatementRewrite
from ddpify.lint.fixes import LineIndex
from ddpify.lint.rule import Edit

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
T = TypeVar("T", str, list)


def statement_edit(a: Anatomy, stmt: ast.stmt, rewrite: StatementRewrite) -> Edit | None:
    """The Edit that replaces `stmt` by `rewrite(its CST statement)`: the whole lines that change.

    None when LibCST cannot parse the script or has no statement where `stmt` starts."""
    parsed = _parsed(a)
    pos = a.pos(stmt)
    new = parsed.rewritten((pos.line, pos.col), rewrite) if parsed else None
    return _changed_lines(a.text, new.code) if new else None


def expression_edit(a: Anatomy, node: ast.AST, rewrite: Callable[[cst.BaseExpression], cst.BaseExpression]) -> Edit | None:
    """The Edit that replaces the expression `node` (with any parentheses around it) by
    `rewrite(its CST expression)`, narrowed to the characters that change (`model` ->
    `model.module` inserts `.module`). None when no CST expression spans exactly what `node` spans."""
    parsed = _parsed(a)
    pos = a.pos(node)
    target = parsed.expressions.get((pos.line, pos.col, pos.end_line, pos.end_col)) if parsed else None
    if target is None:
        return None
    index = LineIndex(a.text)
    node_range = index.offset(pos.line, pos.col), index.offset(pos.end_line, pos.end_col)
    return _changed_characters(index, parsed.module.deep_replace(target, rewrite(target)).code, node_range)  # type: ignore[union-attr]


def _changed_characters(index: LineIndex, new: str, node_range: tuple[int, int]) -> Edit:
    """The Edit of the one run of characters that differs between the indexed text and `new`,
    anchored to the node's range where that is ambiguous (`model.x` -> `model.module.x` inserts
    `.module` after `model`, not `module.` after `model.`)."""
    old = index.text
    head = min(_shared_length(old, new, lambda text, n: text[:n]), node_range[1])
    tail = min(_shared_length(old[head:], new[head:], lambda text, n: text[len(text) - n:]), len(old) - node_range[0])
    line, col = index.position(head)
    end_line, end_col = index.position(len(old) - tail)
    return Edit(line, col, end_line, end_col, new[head:len(new) - tail])


def _shared_length(a: T, b: T, part: Callable[[T, int], T]) -> int:
    """The largest n with part(a, n) == part(b, n) (a shared start or end of two texts, or of
    their lists of lines): a binary search over slice comparisons, which run in C."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if part(a, mid) == part(b, mid) else (low, mid - 1)
    return low


@dataclass(frozen=True)
class _Parsed:
    """A LibCST parse of the script, with its statements and expressions by position."""

    module: cst.Module
    statements: Mapping[Key, cst.BaseStatement]  # a compound, or a line holding one statement
    small_statements: Mapping[Key, cst.BaseSmallStatement]
    expressions: Mapping[Span, cst.BaseExpression]
    parents: Mapping[cst.CSTNode, cst.CSTNode]

    def rewritten(self, key: Key, rewrite: StatementRewrite) -> cst.Module | None:
        """The module with the statement at `key` rewritten, its line first spread out if it shares it."""
        stmt = self.statements.get(key)
        if stmt is not None:
            return self._replace_in_block(stmt, rewrite(_spread_body(stmt)))
        small = self.small_statements.get(key)
        if small is None:
            return None
        holder = self.parents[small]  # `a; b` or the body of `if x: a`
        lines = _one_statement_a_line(holder)  # type: ignore[arg-type]
        index = next(i for i, s in enumerate(holder.body) if s is small)  # type: ignore[attr-defined]
        lines[index:index + 1] = rewrite(lines[index])
        if isinstance(holder, cst.SimpleStatementLine):
            return self._replace_in_block(holder, lines)
        owner = self.parents[holder]
        return self.module.deep_replace(owner, owner.with_changes(body=cst.IndentedBlock(body=lines)))

    def _replace_in_block(self, old: cst.BaseStatement, new: Sequence[cst.BaseStatement]) -> cst.Module | None:
        block = self.parents[old]
        if not isinstance(block, (cst.Module, cst.IndentedBlock)):  # an `elif`
            return None
        body = [s for kept in block.body for s in (new if kept is old else (kept,))]  # type: ignore[attr-defined]
        if block is self.module:
            return self.module.with_changes(body=body)
        return self.module.deep_replace(block, block.with_changes(body=body))  # type: ignore[return-value]


@per_anatomy
def _parsed(a: Anatomy) -> _Parsed | None:
    try:
        module = cst.parse_module(a.text)
    except cst.ParserSyntaxError:
        return None
    index = _Index()
    MetadataWrapper(module, unsafe_skip_copy=True).visit(index)
    return _Parsed(module, index.statements, index.small_statements, index.expressions, index.parents)


class _Index(cst.CSTVisitor):
    """Statements and expressions by where they start (and end), with the parents of statements."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.statements: dict[Key, cst.BaseStatement] = {}
        self.small_statements: dict[Key, cst.BaseSmallStatement] = {}
        self.expressions: dict[Span, cst.BaseExpression] = {}
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self._path: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.BaseStatement, cst.BaseSmallStatement, cst.BaseSuite)) and self._path:
            self.parents[node] = self._path[-1]
        if isinstance(node, (cst.BaseStatement, cst.BaseSmallStatement, cst.BaseExpression)):
            self._record(node)
        self._path.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._path.pop()

    def _record(self, node: cst.CSTNode) -> None:
        where = self.get_metadata(PositionProvider, node)
        start, end = where.start, where.end
        if isinstance(node, cst.BaseCompoundStatement) or (isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1):
            self.statements[start.line, start.column] = node
        elif isinstance(node, cst.BaseSmallStatement):
            self.small_statements[start.line, start.column] = node
        elif isinstance(node, cst.BaseExpression):
            self.expressions.setdefault((start.line, start.column, end.line, end.column), node)


def _spread_body(stmt: cst.BaseStatement) -> cst.BaseStatement:
    """`for x in y: a; b` -> the same loop with `a` and `b` on lines of their own (other statements as they are)."""
    body = getattr(stmt, "body", None)
    if not isinstance(body, cst.SimpleStatementSuite):
        return stmt
    return stmt.with_changes(body=cst.IndentedBlock(body=_one_statement_a_line(body)))


def _one_statement_a_line(holder: cst.SimpleStatementLine | cst.SimpleStatementSuite) -> list[cst.BaseStatement]:
    """The statements of `a; b` (a line, or the body of `if x: a; b`) on lines of their own; the
    comments above stay above the first, the comment after stays after the last."""
    last = len(holder.body) - 1
    lines: list[cst.BaseStatement] = [
        cst.SimpleStatementLine(
            body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)],
            trailing_whitespace=holder.trailing_whitespace if i == last else cst.TrailingWhitespace(),
        )
        for i, small in enumerate(holder.body)
    ]
    lines[0] = lines[0].with_changes(leading_lines=getattr(holder, "leading_lines", ()))
    return lines


def _changed_lines(old: str, new: str) -> Edit | None:
    """The Edit of whole lines that turns `old` into `new`: everything between the lines they
    share at their start and at their end."""
    before, after = _LINE.findall(old), _LINE.findall(new)
    if before == after:
        return None
    head = _shared_length(before, after, lambda lines, n: lines[:n])
    tail = _shared_length(before[head:], after[head:], lambda lines, n: lines[len(lines) - n:])
    end_line, end_col = _line_start(before, len(before) - tail)
    return Edit(head + 1, 0, end_line, end_col, "".join(after[head:len(after) - tail]))


def _line_start(lines: list[str], index: int) -> tuple[int, int]:
    """Where line `index` (0-based) of `lines` starts; past the last line, where the text ends."""
    if index < len(lines) or not lines or lines[-1].endswith(("\n", "\r")):
        return index + 1, 0
    return len(lines), len(lines[-1])
