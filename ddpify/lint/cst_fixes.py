"""Fix edits built with the edit toolkit the convert transforms use (`ddpify.edits`), serialised as text `Edit`s.

A structural fix finds the CST node at an ast node's position in a LibCST parse of the script and
applies the builder the transforms use (`guard`, `first_in_body`, `add_keyword`, `module_of`, ...).
The statement that changes is rendered in place, with the module's indentation and line endings
and inside stand-ins for the blocks around it: LibCST re-indents statements and leaves string
contents alone, so multi-line strings, tabs and CRLF files come out right. A statement that shares
its line (`a; b`, `if x: a`) is first spread out, one statement a line; one replaced by nothing
leaves the comments above it in place. The edits no codemod makes are LibCST builders here too
(`without_module`, `int_from_environment`, `string_like`), and a comment is rewritten as the
Comment node LibCST keeps it in (`comment_edit`, for DDP900).
"""

from __future__ import annotations

import ast
import re
from typing import Callable, Sequence, TypeVar

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpify.anatomy import Anatomy, Pos
from ddpify.anatomy.cache import per_anatomy
from ddpify.edits.expressions import parse_expr
from ddpify.edits.positions import Key, Span, spans_in_place
from ddpify.edits.statements import StatementRewrite, compound_bodies, keep_leading_lines, one_statement_a_line
from ddpify.lint.fixes import LineIndex
from ddpify.lint.rule import Edit

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_Seq = TypeVar("_Seq", str, list)


def statement_edit(a: Anatomy, stmt: ast.stmt, rewrite: StatementRewrite) -> Edit | None:
    """The Edit that replaces `stmt` by `rewrite(its CST statement)`: the whole lines that change.

    None when LibCST cannot parse the script or has no statement where `stmt` starts."""
    parsed = _parsed(a)
    pos = a.pos(stmt)
    rewritten = parsed.rewritten((pos.line, pos.col), rewrite) if parsed else None
    code = parsed.code_with(*rewritten) if parsed and rewritten else None
    return _changed_lines(a.text, code) if code else None


def statement_edit_with(a: Anatomy, stmt: ast.stmt, nodes: Sequence[ast.AST],
                        rewrite: Callable[[cst.BaseStatement, list[cst.CSTNode]], Sequence[cst.BaseStatement]]) -> Edit | None:
    """Like `statement_edit`, `rewrite` also given the CST expressions that span the ast `nodes`
    inside `stmt`. None when one has none."""
    parsed = _parsed(a)
    holder = parsed.statement_at(a.pos(stmt)) if parsed else None
    expressions = parsed.expressions_in(holder) if parsed and holder else {}
    values = [expressions.get((p.line, p.col, p.end_line, p.end_col)) for p in map(a.pos, nodes)]
    if any(value is None for value in values):
        return None
    return statement_edit(a, stmt, lambda node: rewrite(node, values))  # type: ignore[arg-type]


def expression_edit(a: Anatomy, node: ast.AST, rewrite: Callable[[cst.BaseExpression], cst.BaseExpression]) -> Edit | None:
    """The Edit that replaces the expression `node` (with any parentheses around it) by
    `rewrite(its CST expression)`, narrowed to the characters that change (`model` ->
    `model.module` inserts `.module`). None when no CST expression spans exactly what `node` spans."""
    parsed, holder = _parsed(a), a.stmt_of.get(node)
    if parsed is None or holder is None:
        return None
    pos = a.pos(node)
    stmt = parsed.statement_at(a.pos(holder))
    target = parsed.expressions_in(stmt).get((pos.line, pos.col, pos.end_line, pos.end_col)) if stmt else None
    code = parsed.code_with(stmt, [stmt.deep_replace(target, rewrite(target))]) if target and stmt else None  # type: ignore[list-item]
    if code is None:
        return None
    node_range = parsed.text.offset(pos.line, pos.col), parsed.text.offset(pos.end_line, pos.end_col)
    return _changed_characters(parsed.text, code, node_range)


def comment_edit(a: Anatomy, line: int, col: int, text: str) -> Edit | None:
    """The Edit that makes the comment starting at (`line`, `col`) read `text`; an empty `text`
    removes the comment with the spaces before it (a comment on a line of its own leaves the line
    empty). LibCST keeps a comment in the whitespace after a statement, on a line of its own or
    between the brackets of a call spread over lines: each is a `Comment` node that the edit
    replaces, so indentation, tabs and line endings stay as they are. None when LibCST cannot parse
    the script or has no comment there."""
    parsed = _parsed(a)
    if parsed is None:
        return None
    rewriter = _CommentRewriter((line, col), text)
    code = MetadataWrapper(parsed.module, unsafe_skip_copy=True).visit(rewriter).code
    if not rewriter.done:
        return None
    start = parsed.text.offset(line, col)
    return _changed_characters(parsed.text, code, (start, start))


class _CommentRewriter(cst.CSTTransformer):
    """The comment that starts at `at` made to read `text` (removed, with its spaces, if empty)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, at: Key, text: str) -> None:
        super().__init__()
        self.at, self.text, self.done = at, text, False

    def leave_TrailingWhitespace(self, original_node: cst.TrailingWhitespace, updated_node: cst.TrailingWhitespace) -> cst.TrailingWhitespace:
        if not self._is_target(original_node.comment):
            return updated_node
        if self.text:
            return updated_node.with_changes(comment=cst.Comment(self.text))
        return updated_node.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)

    def leave_EmptyLine(self, original_node: cst.EmptyLine, updated_node: cst.EmptyLine) -> cst.EmptyLine:
        if not self._is_target(original_node.comment):
            return updated_node
        if self.text:
            return updated_node.with_changes(comment=cst.Comment(self.text))
        return updated_node.with_changes(indent=False, whitespace=cst.SimpleWhitespace(""), comment=None)

    def _is_target(self, comment: cst.Comment | None) -> bool:
        if comment is None or self.done:
            return False
        start = self.get_metadata(PositionProvider, comment).start
        self.done = (start.line, start.column) == self.at
        return self.done


def without_module(attribute: cst.BaseExpression) -> cst.BaseExpression:
    """`model.module` -> `model` (parentheses around `model` kept): convert's `module_of` undone."""
    assert isinstance(attribute, cst.Attribute)
    return attribute.value


def int_from_environment(default: cst.BaseExpression, environ: str, variable: str) -> cst.Call:
    """`int(<environ>.get("<variable>", <default>))`: the environment variable, else `default`."""
    get = cst.Attribute(value=parse_expr(environ), attr=cst.Name("get"))
    return cst.Call(func=cst.Name("int"), args=[cst.Arg(cst.Call(func=get, args=[cst.Arg(cst.SimpleString(f'"{variable}"')), cst.Arg(default)]))])


def string_like(literal: cst.BaseExpression, value: str) -> cst.SimpleString:
    """A string literal of `value` (no quotes or backslashes in it) with the prefix and quotes of
    `literal` (of its first part, when implicitly concatenated: `'gl' 'oo'`)."""
    while isinstance(literal, cst.ConcatenatedString):
        literal = literal.left
    assert isinstance(literal, cst.SimpleString)
    return cst.SimpleString(f"{literal.prefix}{literal.quote}{value}{literal.quote}")


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


def _shared_length(a: _Seq, b: _Seq, part: Callable[[_Seq, int], _Seq]) -> int:
    """The largest n with part(a, n) == part(b, n) (a shared start or end of two texts, or of
    their lists of lines): a binary search over slice comparisons, which run in C."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if part(a, mid) == part(b, mid) else (low, mid - 1)
    return low


class _Parsed:
    """A LibCST parse of the script. Its statements are paired with the ast's block by block, as the
    codemods' edit pass pairs them, so the ast's positions find them; the expressions of a statement
    are located when first asked for, by LibCST positions in a module of that statement alone (the
    positions of a whole module cost a lint with fixes most of its time)."""

    def __init__(self, a: Anatomy, module: cst.Module) -> None:
        self.a, self.module, self.text = a, module, LineIndex(a.text)
        self.statements: dict[Key, cst.BaseStatement] = {}  # a compound statement, or a line of simple ones
        self.small_statements: dict[Key, cst.BaseSmallStatement] = {}
        self.first_lines: dict[cst.BaseStatement, int] = {}
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}  # of statements, suites and clauses (`else:`)
        self._expressions: dict[cst.BaseStatement, dict[Span, cst.BaseExpression]] = {}
        _note_parent(module, self.parents)
        self._pair(module.body, a.tree.body)

    def _pair(self, nodes: Sequence[cst.BaseStatement], stmts: Sequence[ast.stmt]) -> None:
        """Note each CST statement of a block (and, inside, of its blocks) at its ast statement's position."""
        index = 0
        for node in nodes:
            self._note(node, stmts[index])
            if isinstance(node, cst.SimpleStatementLine):
                self._pair_small(node.body, stmts[index:index + len(node.body)])
                index += len(node.body)
                continue
            elif_node, elif_stmt = node, stmts[index]
            while isinstance(elif_node, cst.If) and isinstance(elif_node.orelse, cst.If):
                elif_node, elif_stmt = elif_node.orelse, elif_stmt.orelse[0]  # type: ignore[attr-defined]
                self._note(elif_node, elif_stmt)
            for suite, body in compound_bodies(node, stmts[index]):  # type: ignore[arg-type]
                _note_parent(suite, self.parents)
                if isinstance(suite, cst.IndentedBlock):
                    self._pair(suite.body, body)
                else:
                    self._pair_small(suite.body, body)  # type: ignore[arg-type]
            index += 1

    def _note(self, node: cst.BaseStatement, stmt: ast.stmt) -> None:
        pos = self.a.pos(stmt)
        self.statements[pos.line, pos.col] = node
        self.first_lines[node] = pos.line
        _note_clauses(node, self.parents)

    def _pair_small(self, nodes: Sequence[cst.BaseSmallStatement], stmts: Sequence[ast.stmt]) -> None:
        for node, stmt in zip(nodes, stmts):
            pos = self.a.pos(stmt)
            self.small_statements[pos.line, pos.col] = node

    def expressions_in(self, stmt: cst.BaseStatement) -> dict[Span, cst.BaseExpression]:
        """The expressions of a statement of a block (of a compound one, outside an indented body that
        ends it) by their span in the script."""
        if stmt not in self._expressions:
            self._expressions[stmt] = self._locate_expressions(stmt)
        return self._expressions[stmt]

    def _locate_expressions(self, stmt: cst.BaseStatement) -> dict[Span, cst.BaseExpression]:
        expressions: dict[Span, cst.BaseExpression] = {}
        for node, span in spans_in_place(stmt, self.first_lines[stmt], self._indents_around(stmt), self.module).items():
            if isinstance(node, cst.BaseExpression):
                expressions.setdefault(span, node)
        return expressions

    def _indents_around(self, stmt: cst.CSTNode) -> list[str | None]:
        """The indents of the blocks that hold `stmt`, innermost first."""
        return [level.indent for level in self._levels_from(self.parents[stmt])]

    def _levels_from(self, node: cst.CSTNode) -> list[cst.IndentedBlock | cst.Match]:
        """The nodes from `node` up that indent what they hold, innermost first: indented blocks, and
        a `match`, whose cases stand one level in."""
        levels = []
        while node is not self.module:
            if isinstance(node, (cst.IndentedBlock, cst.Match)):
                levels.append(node)
            node = self.parents[node]
        return levels

    def rewritten(self, key: Key, rewrite: StatementRewrite) -> tuple[cst.BaseStatement, list[cst.BaseStatement]] | None:
        """The statement of its block that holds the statement at `key`, and what replaces it: that
        statement rewritten, its line first spread out if it shares it (`a; b`, `if x: a`)."""
        stmt = self.statements.get(key)
        if stmt is not None and not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) > 1):
            return (stmt, list(rewrite(stmt))) if self._in_block(stmt) else None
        small = self.small_statements.get(key)
        if small is None:
            return None
        holder = self.parents[small]
        lines = one_statement_a_line(holder)  # type: ignore[arg-type]
        index = next(i for i, s in enumerate(holder.body) if s is small)  # type: ignore[attr-defined]
        lines[index:index + 1] = rewrite(lines[index])
        if isinstance(holder, cst.SimpleStatementLine):
            return holder, lines
        owner = self.parents[holder]
        return self._in_its_statement(owner, owner.with_changes(body=cst.IndentedBlock(body=lines)))

    def statement_at(self, pos: Pos) -> cst.BaseStatement | None:
        """The statement of its block that holds the ast statement at `pos`."""
        node = self.statements.get((pos.line, pos.col)) or self.small_statements.get((pos.line, pos.col))
        while node is not None and not self._in_block(node):
            node = self.parents.get(node)
        return node  # type: ignore[return-value]

    def code_with(self, old: cst.BaseStatement, new: Sequence[cst.BaseStatement]) -> str | None:
        """The script's text with the statement `old` (of a block) replaced by `new`; None when
        `old` does not render as it reads in the file. As in the codemods, the comments and blank
        lines above `old` stay above what replaces it; when nothing does, where they are (above
        the statement after it)."""
        newline = "" if self.module.has_trailing_newline else self.module.default_newline  # a statement renders with one
        text = self.text.text + newline
        block = self._block_of(old)
        replaced = old if new else old.with_changes(leading_lines=())
        before = self._in_place([replaced], block)
        start = self.text.offset(self.first_lines[old] - len(replaced.leading_lines), 0)  # type: ignore[attr-defined]
        if text[start:start + len(before)] != before:
            return None
        after = [keep_leading_lines(old, new[0]), *new[1:]] if new else []
        code = text[:start] + self._in_place(after, block) + text[start + len(before):]
        return code[:len(code) - len(newline)]

    def _in_place(self, stmts: Sequence[cst.BaseStatement], block: cst.CSTNode) -> str:
        """`stmts` rendered as they read in `block`: inside stand-ins (`if _:`) for the blocks
        around it, so at their indentation, whose header lines are then dropped."""
        if not stmts:
            return ""
        wrapped, depth = list(stmts), 0
        for level in self._levels_from(block):
            body = (level.with_changes(body=wrapped, header=cst.TrailingWhitespace(), footer=()) if isinstance(level, cst.IndentedBlock)
                    else cst.IndentedBlock(body=wrapped, indent=level.indent))
            wrapped, depth = [cst.If(test=cst.Name("_"), body=body)], depth + 1
        code = "".join(self.module.code_for_node(s) for s in wrapped)
        return code.split(self.module.default_newline, depth)[depth]

    def _in_its_statement(self, node: cst.CSTNode, new: cst.CSTNode) -> tuple[cst.BaseStatement, list[cst.BaseStatement]]:
        """The statement of its block that holds `node` (an `else:`, or the statement itself), with `node` replaced by `new`."""
        while not self._in_block(node):
            parent = self.parents[node]
            node, new = parent, parent.deep_replace(node, new)
        return node, [new]  # type: ignore[list-item]

    def _in_block(self, node: cst.CSTNode) -> bool:
        return isinstance(self.parents.get(node), (cst.Module, cst.IndentedBlock))

    def _block_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The module or indented block that holds the statement that is or holds `node`."""
        parent = self.parents[node]
        while not isinstance(parent, (cst.Module, cst.IndentedBlock)):
            parent = self.parents[parent]
        return parent


@per_anatomy
def _parsed(a: Anatomy) -> _Parsed | None:
    try:
        module = cst.parse_module(a.text)
    except cst.ParserSyntaxError:
        return None
    return _Parsed(a, module)


_CLAUSES = ("body", "orelse", "handlers", "finalbody", "cases")


def _note_parent(node: cst.CSTNode, parents: dict[cst.CSTNode, cst.CSTNode]) -> None:
    """Record `node` as the parent of the statements of its block (or line), and of its suites and
    clauses (`else:`, `except:`, an `elif`)."""
    if isinstance(node, (cst.Module, cst.BaseSuite, cst.SimpleStatementLine)):
        parents.update((child, node) for child in node.body)
        return
    for name in _CLAUSES:
        value = getattr(node, name, None)
        for child in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(child, cst.CSTNode):
                parents[child] = node


def _note_clauses(node: cst.CSTNode, parents: dict[cst.CSTNode, cst.CSTNode]) -> None:
    """`_note_parent` for a statement and for the clauses it holds (`else:`, `except:`, `case`, an `elif`)."""
    _note_parent(node, parents)
    for name in _CLAUSES:
        value = getattr(node, name, None)
        for child in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(child, cst.CSTNode) and not isinstance(child, cst.BaseSuite):
                _note_clauses(child, parents)


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
