"""Where an edit lands: the (line, column) key of an ast statement, the spans of CST nodes, and the
end of a script's opening imports (where added helpers go).

The anatomy locates code by `ast` positions; LibCST nodes carry none of their own. A statement is
found by the key of its first line and column; the nodes of one statement are given spans in the
file by `spans_in_place`, which reads that statement alone (not the whole module) with LibCST's
PositionProvider.
"""

from __future__ import annotations

import ast
from typing import Mapping, Sequence

import libcst as cst
from libcst import CSTNode
from libcst._position import CodePosition
from libcst.metadata import CodeRange, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from ddpify.anatomy import Pos

Key = tuple[int, int]
Span = tuple[int, int, int, int]


def key_of(node: ast.AST | Pos) -> Key:
    """The (line, column) a CST node must start at to be the same node as this ast node/position."""
    if isinstance(node, Pos):
        return node.line, node.col
    return node.lineno, node.col_offset


def decorators_line(stmt: ast.stmt) -> int:
    """The first line of a statement and its decorators (ast starts a decorated def at `def`)."""
    return min([stmt.lineno, *(decorator.lineno for decorator in getattr(stmt, "decorator_list", ()))])


def spans_in_place(stmt: cst.BaseStatement, first_line: int, indents: Sequence[str | None], module: cst.Module) -> dict[cst.CSTNode, Span]:
    """The spans in the file of the nodes of a statement of a block (of a compound one, outside an
    indented body that ends it), whose first line is `first_line`: read in a module of just that
    statement, nested in stand-ins at its indentation (`indents`: of the blocks around it, innermost first)."""
    alone = _without_indented_body(stmt)
    nested: cst.CSTNode = alone
    for indent in indents:
        nested = cst.If(test=cst.Name("_"), body=cst.IndentedBlock(body=[nested], indent=indent))  # type: ignore[list-item]
    alone_module = cst.Module(body=[nested], default_indent=module.default_indent, default_newline=module.default_newline)  # type: ignore[list-item]
    positions = positions_of(alone_module)
    shift = first_line - positions[alone].start.line
    return {node: (where.start.line + shift, where.start.column, where.end.line + shift, where.end.column) for node, where in positions.items()}


def positions_of(module: cst.Module) -> Mapping[cst.CSTNode, CodeRange]:
    """What LibCST's PositionProvider finds for the nodes of `module`, in its one codegen pass (a
    MetadataWrapper's `resolve` walks the whole tree once more, for batchable providers, even with none)."""
    provider = PositionProvider()
    module._codegen(_PositionsState(default_indent=module.default_indent, default_newline=module.default_newline, provider=provider))
    return provider._computed


class _PositionsState(PositionProvidingCodegenState):
    """LibCST's PositionProvider's codegen state, the same positions at less cost: a token without a line
    break only moves the column (no regular expression split), and each node's syntactic position is
    recorded by a plain context object instead of one made from a generator."""

    def _update_position(self, value: str) -> None:
        if "\n" in value or "\r" in value:
            super()._update_position(value)
        else:
            self.column += len(value)

    def record_syntactic_position(self, node: CSTNode, *, start_node: CSTNode | None = None,
                                  end_node: CSTNode | None = None) -> _SyntacticPosition:
        return _SyntacticPosition(self, node, start_node, end_node)


class _SyntacticPosition:
    """Records a node's range (or that of `start_node` to `end_node`) as LibCST's
    PositionProvidingCodegenState.record_syntactic_position does."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _PositionsState, node: CSTNode, start_node: CSTNode | None, end_node: CSTNode | None) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = CodePosition(self.state.line, self.state.column)

    def __exit__(self, *_exc: object) -> None:
        computed = self.state.provider._computed
        start = computed[self.start_node].start if self.start_node is not None else self.start
        end = computed[self.end_node].end if self.end_node is not None else CodePosition(self.state.line, self.state.column)
        computed[self.node] = CodeRange(start, end)


def _without_indented_body(stmt: cst.CSTNode) -> cst.CSTNode:
    """A compound statement whose indented body ends it with `pass` for that body (others as they are)."""
    ends = not any(getattr(stmt, part, None) for part in ("orelse", "handlers", "finalbody"))
    if ends and isinstance(getattr(stmt, "body", None), cst.IndentedBlock):
        return stmt.with_changes(body=cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])]))
    return stmt


def last_leading_import(tree: ast.Module) -> ast.stmt | None:
    """The last import of the script's opening block of imports (docstring and imports)."""
    last = None
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            last = stmt
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and last is None:
            continue
        elif last is not None and not _is_trivial(stmt):
            break
    return last


def _is_trivial(stmt: ast.stmt) -> bool:
    """Statements that may sit between imports (try/except ImportError blocks count as imports)."""
    if isinstance(stmt, ast.Try):
        return all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in stmt.body)
    return False
