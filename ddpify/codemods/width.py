"""Keep converted lines within the file's own width.

A conversion lengthens lines: `sampler=DistributedSampler(...)` joins a DataLoader call, a guard
indents a statement, a wrap names the device ids. After the last stage every statement with a line
wider than the file's widest original line (at least PEP 8's 79 columns) is laid out again, the way
black would: a comment line above it that no longer fits is re-flowed; the outermost one-line call
(or dict) that ends a line still too wide gets one item a line, with a trailing comma (a conditional
`a if c else b` goes in brackets, a part a line; a comprehension puts its element and its `for` on
lines of their own), repeated inward until every line fits or nothing is left to open; then a
trailing comment that still overflows moves above the statement (not a suppression, `# ddpify: ignore[...]`
or `# noqa`: above the statement it would suppress nothing). A body on its header's line (`if c: a; b`) that overflows
goes on lines of its own, the header of a `with`/`if`/`for`/`while` opens like a statement's line
(`with (` ... `):`), and a long `from m import a, b` goes into brackets. A string literal still
too wide on a line of its own inside brackets is split after spaces into adjacent literals, which
Python joins into the same string (black's preview style): a part without a replacement field
drops the `f`. Lines the conversion did not widen never exceed the limit, so they are never touched.
"""

from __future__ import annotations

import ast
import bisect
import re
import textwrap
from typing import Iterator, Mapping, Sequence

import libcst as cst
from libcst.metadata import CodeRange

from ddpify.codemods.codegen import code_of
from ddpify.edits.positions import decorators_line, positions_of
from ddpify.edits.statements import compound_bodies, one_statement_a_line

PEP8_WIDTH = 79
_SUPPRESSION = re.compile(r"#\s*(?:ddpify:\s*ignore|noqa)\b", re.IGNORECASE)  # what lint reads on the line it reports
_MAX_OPENED = 8  # calls opened per statement at the most


def width_limit(original: str) -> int:
    """The file's own width: its widest line, or PEP 8's 79 columns if all are narrower."""
    return max([PEP8_WIDTH, *(len(line) for line in original.splitlines())])


def fit_to_width(module: cst.Module, code: str, origins: list[int], limit: int, tree: ast.Module) -> tuple[str, list[int]]:
    """`code` (`module`'s text, `tree` its parse) with each statement that has a line wider than `limit`
    laid out again (a lone comment line re-flowed), and `origins` (the original line of each line)
    carried along. Each statement is taken from `module` and rendered on its own, so the rest of the
    text is neither rendered nor diffed again."""
    lines = code.splitlines(keepends=True)
    wide = [number for number, line in enumerate(lines, 1) if len(line.rstrip("\r\n")) > limit]
    if not wide:
        return code, origins
    origins = list(origins)
    held: dict[ast.stmt, _Held] = {}
    _pair_statements(module.body, tree.body, wide, held)
    for first, last, stmt in reversed(_spans(tree, lines, wide)):
        new = _fitted_lines(lines[first - 1:last], limit, module.default_indent, _statement_on(held.get(stmt), first, last))  # type: ignore[arg-type]
        if new is not None:
            lines[first - 1:last] = new
            origins[first - 1:last] = [origins[min(first - 1 + i, last - 1)] for i in range(len(new))]
    return "".join(lines), origins


def _spans(tree: ast.Module, lines: list[str], wide: list[int]) -> list[tuple[int, int, ast.stmt | None]]:
    """The (first, last) lines to lay out again for the wide lines, in order and apart, with the
    statement they are of: the simple statement that spans one (or a compound whose body is on its
    header line), the one-line header of a `with`/`if`/`for`/`while`, or a comment line between
    statements (None)."""
    innermost: dict[int, ast.stmt] = {}  # wide line -> the statement that starts last among those spanning it
    for stmt in _statements_over(tree.body, wide):
        for line in wide[bisect.bisect_left(wide, stmt.lineno):bisect.bisect_right(wide, stmt.end_lineno or stmt.lineno)]:
            innermost[line] = stmt
    spans: dict[tuple[int, int], ast.stmt | None] = {}
    for line in wide:
        inner = innermost.get(line)
        if inner is not None and (not isinstance(inner, _COMPOUND) or inner.end_lineno == inner.lineno or _header_alone(inner, line)):
            spans[inner.lineno, line if isinstance(inner, _COMPOUND) else inner.end_lineno or inner.lineno] = inner
        elif lines[line - 1].lstrip().startswith("#") and (inner is None or inner.lineno != line):
            spans[line, line] = None
    ordered = [(first, last, spans[first, last]) for first, last in sorted(spans)]
    return [span for index, span in enumerate(ordered) if index == 0 or span[0] > ordered[index - 1][1]]


def _statements_over(body: Sequence[ast.stmt], wide: list[int]) -> Iterator[ast.stmt]:
    """The statements that span a wide line, each before those nested in it (the rest are not entered)."""
    for stmt in body:
        if bisect.bisect_left(wide, stmt.lineno) < bisect.bisect_right(wide, stmt.end_lineno or stmt.lineno):
            yield stmt
            yield from _statements_over(list(_nested_statements(stmt)), wide)


def _nested_statements(stmt: ast.stmt) -> Iterator[ast.stmt]:
    """The statements of a compound's blocks, its except clauses and match cases included."""
    for block in ("body", "orelse", "finalbody"):
        yield from getattr(stmt, block, ())
    for clause in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
        yield from clause.body


def _header_alone(stmt: ast.stmt, line: int) -> bool:
    """Is `line` the whole header of a `with`/`if`/`for`/`while` whose body starts below it?"""
    if not isinstance(stmt, (ast.With, ast.If, ast.For, ast.While)) or stmt.lineno != line or stmt.body[0].lineno == line:
        return False
    parts = [item.context_expr for item in stmt.items] if isinstance(stmt, ast.With) else [getattr(stmt, "test", None) or stmt.iter]  # type: ignore[attr-defined]
    return all(part.end_lineno == line for part in parts)


_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
             ast.AsyncFunctionDef, ast.ClassDef, ast.Match, *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))


_Held = tuple[cst.BaseStatement, int, int]  # the CST statement that holds an ast statement, and its first and last lines


def _pair_statements(statements: Sequence[cst.BaseStatement], stmts: Sequence[ast.stmt], wide: list[int], held: dict[ast.stmt, _Held]) -> None:
    """Pair each ast statement that spans a wide line with the CST statement holding it (a line `a; b`
    holds both; a compound, the statements of a body on its header line), block by block."""
    index = 0
    for node in statements:
        size = len(node.body) if isinstance(node, cst.SimpleStatementLine) else 1
        own, index = stmts[index:index + size], index + size
        first, last = decorators_line(own[0]), own[-1].end_lineno or own[-1].lineno
        if bisect.bisect_left(wide, first) == bisect.bisect_right(wide, last):
            continue
        for stmt in own:
            held[stmt] = node, first, last
        if isinstance(node, cst.BaseCompoundStatement):
            for suite, inner in compound_bodies(node, own[0]):
                if isinstance(suite, cst.IndentedBlock):
                    _pair_statements(suite.body, inner, wide, held)
                else:
                    held.update((stmt, (node, first, last)) for stmt in inner)


def _statement_on(held: _Held | None, first: int, last: int) -> tuple[cst.BaseStatement, bool] | None:
    """The CST statement on lines `first` to `last`, and whether it stands in for a compound's header
    alone (its body a `pass`, dropped after); None where it spans other lines."""
    if held is None or held[1] != first:
        return None
    node, _, end = held
    if end == last:
        return node, False
    if isinstance(node, _HEADERS) and isinstance(node.body, cst.IndentedBlock):
        alone = node.body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])], footer=())
        return node.with_changes(body=alone, **({"orelse": None} if hasattr(node, "orelse") else {})), True
    return None


def _fitted_lines(lines: list[str], limit: int, step: str, statement: tuple[cst.BaseStatement, bool] | None) -> list[str] | None:
    """The lines of one statement (or comment line) laid out again at their indentation (`statement`:
    its CST node where the code's module holds it, else it is parsed from the lines); None when they
    can't be taken out on their own (a blank line or a string line left of the indentation)."""
    first = lines[0]
    indent = first[: len(first) - len(first.lstrip())]
    if any(not line.strip() or not line.startswith(indent) for line in lines):
        return None
    newline = first[len(first.rstrip("\r\n")):] or "\n"
    if first.lstrip().startswith("#"):
        comment = cst.EmptyLine(comment=cst.Comment(first.strip()))
        return [f"{indent}{line.comment.value}{newline}" for line in _reflowed(comment, len(indent), limit)]  # type: ignore[union-attr]
    if statement is not None:
        node, stand_in = statement
        module: cst.Module | None = cst.Module(body=[node.with_changes(leading_lines=())], default_newline=newline)
    else:
        text = "".join(line[len(indent):] for line in lines)
        module, stand_in = _parsed(text), False
        if module is None and len(lines) == 1:  # a compound's header alone: parsed with a stand-in body, dropped after
            module, stand_in = _parsed(f"{text}{step}pass{newline}"), True
    if module is None:
        return None
    fitted = fit(module.body[0], len(indent), limit, step)
    code = code_of(module.with_changes(body=[fitted], default_indent=step)).splitlines(keepends=True)
    return [f"{indent}{line}" for line in (code[:-1] if stand_in else code)]


def _parsed(text: str) -> cst.Module | None:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError:
        return None


def fit(stmt: cst.BaseStatement, column: int, limit: int, step: str = "    ") -> cst.BaseStatement:
    """`stmt` (starting at `column`) with its comments re-flowed and its one-line calls opened (each
    item `step` deeper), until its lines are within `limit` or nothing is left to open."""
    stmt = _leading_comments_fitted(stmt, column, limit)
    if isinstance(stmt, cst.BaseCompoundStatement) and isinstance(stmt.body, cst.SimpleStatementSuite):
        stmt = _body_spread(stmt, column, limit, step)
    if not isinstance(stmt, (cst.SimpleStatementLine, *_HEADERS)):
        return stmt
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.ImportFrom):
        stmt = _imports_opened(stmt, column, limit, step)
    for _ in range(_MAX_OPENED):
        opened_stmt = _first_wide_line_laid_out(stmt, column, limit, step)
        if opened_stmt is None:
            break
        stmt = opened_stmt
    return _trailing_comment_fitted(stmt, column, limit) if isinstance(stmt, cst.SimpleStatementLine) else stmt


_HEADERS = (cst.With, cst.If, cst.For, cst.While)  # compound statements whose header line can be laid out


def _body_spread(stmt: cst.BaseCompoundStatement, column: int, limit: int, step: str) -> cst.BaseCompoundStatement:
    """`if c: a; b` too wide: the body on lines of its own below the header, each fitted."""
    if _first_line_width(stmt, column) <= limit:
        return stmt
    lines = [fit(line, column + len(step), limit, step) for line in one_statement_a_line(stmt.body)]
    return stmt.with_changes(body=cst.IndentedBlock(body=lines))


def _imports_opened(stmt: cst.SimpleStatementLine, column: int, limit: int, step: str) -> cst.SimpleStatementLine:
    """`from m import a, b, c` too wide: the names in brackets, one a line."""
    node = stmt.body[0]
    assert isinstance(node, cst.ImportFrom)
    if node.lpar is not None or isinstance(node.names, cst.ImportStar) or _first_line_width(stmt, column) <= limit:
        return stmt
    last = len(node.names) - 1
    names = [alias.with_changes(comma=cst.Comma(whitespace_after=_line_break("" if index == last else step)))
             for index, alias in enumerate(node.names)]
    opened_import = node.with_changes(names=names, lpar=cst.LeftParen(whitespace_after=_line_break(step)), rpar=cst.RightParen())
    return stmt.with_changes(body=[opened_import])


def _first_line_width(stmt: cst.BaseStatement, column: int) -> int:
    code = _code_of(stmt.with_changes(leading_lines=()) if hasattr(stmt, "leading_lines") else stmt)
    return column + len(code.splitlines()[0])


# ----- comments -------------------------------------------------------------------------------
def _leading_comments_fitted(stmt: cst.BaseStatement, column: int, limit: int) -> cst.BaseStatement:
    """Each comment line above the statement that overflows, re-flowed over several (on its own: a
    neighbour may be the user's, whose lines stay as written)."""
    if not hasattr(stmt, "leading_lines"):
        return stmt
    return stmt.with_changes(leading_lines=[line for empty in stmt.leading_lines for line in _reflowed(empty, column, limit)])


def _trailing_comment_fitted(stmt: cst.SimpleStatementLine, column: int, limit: int) -> cst.SimpleStatementLine:
    """A trailing comment that overflows its line moves above the statement, unless it is a suppression."""
    comment = stmt.trailing_whitespace.comment
    if comment is None or _SUPPRESSION.search(comment.value) or _last_line_width(stmt, column) <= limit:
        return stmt
    moved = _reflowed(cst.EmptyLine(comment=comment), column, limit)
    trailing = stmt.trailing_whitespace.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, *moved], trailing_whitespace=trailing)


def _reflowed(line: cst.EmptyLine, column: int, limit: int) -> list[cst.EmptyLine]:
    comment = line.comment
    if comment is None or column + len(comment.value) <= limit:
        return [line]
    text = comment.value.lstrip("#").strip()
    parts = textwrap.wrap(text, width=max(limit - column - 2, 20), break_long_words=False, break_on_hyphens=False)
    return [line.with_changes(comment=cst.Comment(f"# {part}")) for part in parts]


def _last_line_width(stmt: cst.BaseStatement, column: int) -> int:
    code = _code_of(stmt.with_changes(leading_lines=()) if hasattr(stmt, "leading_lines") else stmt)
    return column + len(code.rstrip("\r\n").splitlines()[-1])


# ----- calls ----------------------------------------------------------------------------------
Positions = Mapping[cst.CSTNode, CodeRange]


def _first_wide_line_laid_out(stmt: cst.BaseStatement, column: int, limit: int, step: str) -> cst.BaseStatement | None:
    """`stmt` with its first too-wide line laid out: a call that ends it opened, else a string that
    starts it split (None: every line fits, or nothing on that line can help). Of a compound
    statement only the header is looked at."""
    module = cst.Module(body=[_alone(stmt)])
    lines = code_of(module).splitlines()
    wide = next((number for number, line in enumerate(lines, 1) if column + len(line) > limit), None)
    if wide is None:
        return None
    positions = positions_of(module)
    return _open_a_call(stmt, positions, lines, wide, column, limit, step) or _split_a_string(stmt, positions, lines, wide, column, limit)


def _open_a_call(stmt: cst.BaseStatement, positions: Positions, lines: list[str], wide: int, column: int, limit: int,
                 step: str) -> cst.BaseStatement | None:
    """`stmt` with the outermost one-line call (or dict, or conditional) that ends line `wide` opened,
    one item a line (None: no bracket on that line can be opened to help)."""
    line = lines[wide - 1]
    found = [
        (where.start.column, node) for node, where in positions.items()
        if _openable(node) and where.start.line == wide and where.end.line == wide
        and _closes_the_line(line[where.end.column:]) and column + _opening_width(node, where.start.column) <= limit
    ]
    if not found:
        return None
    _, node = min(found, key=lambda start_node: start_node[0])
    indent = line[: len(line) - len(line.lstrip())]
    return stmt.deep_replace(node, _opened(node, indent, step))  # type: ignore[return-value]


# ----- strings --------------------------------------------------------------------------------
def _split_a_string(stmt: cst.BaseStatement, positions: Positions, lines: list[str], wide: int, column: int,
                    limit: int) -> cst.BaseStatement | None:
    """`stmt` with the one-line string literal that starts line `wide` (inside brackets, once a call
    is opened) split at spaces into adjacent literals, a line each, which Python joins into the same
    string (None: no string there can be split to help)."""
    if wide == 1 or lines[wide - 2].rstrip().endswith("\\"):
        return None  # a statement's first line, or a backslash continuation, is no place for a line break
    line = lines[wide - 1]
    indent = line[: len(line) - len(line.lstrip())]
    lefts = {node.left for node in positions if isinstance(node, cst.ConcatenatedString)}  # must stay one literal
    string = next((node for node, where in positions.items() if isinstance(node, _STRINGS) and node not in lefts
                   and where.start.line == wide and where.end.line == wide and where.start.column == len(indent)), None)
    if string is None:
        return None
    parts = _string_parts(_code_of_node(string.with_changes(lpar=(), rpar=())), limit - column - len(indent),
                          len(line) - len(indent) - len(_code_of_node(string)))
    if len(parts) < 2:
        return None
    joined = cst.parse_expression(parts[-1])
    for part in reversed(parts[:-1]):
        joined = cst.ConcatenatedString(cst.parse_expression(part), joined, whitespace_between=_line_break(indent))  # type: ignore[arg-type]
    return stmt.deep_replace(string, joined.with_changes(lpar=string.lpar, rpar=string.rpar))  # type: ignore[return-value]


_STRINGS = (cst.SimpleString, cst.FormattedString)


def _string_parts(literal: str, width: int, after: int) -> list[str]:
    """`literal` (`f"a {b} c"`, one line) as literals of `width` columns at the most (the last also
    followed by `after` columns), split after spaces outside replacement fields; a part without a
    field loses the `f` prefix."""
    prefix = literal[: len(literal) - len(literal.lstrip("rRbBuUfF"))]
    quote = literal[len(prefix)]
    body = literal[len(prefix) + 1:-1]
    if literal[len(prefix):len(prefix) + 3] in ('"""', "'''") or not literal.endswith(quote):
        return [literal]
    cuts = _split_points(body, formatted="f" in prefix.lower())
    room = width - len(prefix) - 2
    parts, start = [], 0
    while start < len(body):
        if len(body) - start + after <= room:
            parts.append(body[start:])
            break
        fitting = [cut for cut in cuts if start < cut and cut - start <= room]
        cut = fitting[-1] if fitting else next((c for c in cuts if c > start), len(body))
        parts.append(body[start:cut])
        start = cut
    return [f"{_prefix_for(prefix, part)}{quote}{part}{quote}" for part in parts]


def _split_points(body: str, formatted: bool) -> list[int]:
    """Where a string's text may end a part: after a space outside `{...}` fields (and the strings
    inside them), not after a backslash; nowhere in a string with a named escape (`\\N{...}`)."""
    if "\\N{" in body:
        return []
    cuts, depth, index = [], 0, 0
    while index < len(body):
        char = body[index]
        if formatted and char in "{}" and body[index:index + 2] in ("{{", "}}") and depth == 0:
            index += 2
            continue
        if depth and char in "'\"":
            index = body.find(char, index + 1) + 1 or len(body)
            continue
        if formatted and char == "{":
            depth += 1
        elif formatted and char == "}":
            depth -= 1
        elif char == " " and depth == 0 and index > 0 and body[index - 1] != "\\" and index + 1 < len(body):
            cuts.append(index + 1)
        index += 1
    return cuts


def _prefix_for(prefix: str, part: str) -> str:
    """The literal's prefix, without `f` for a part that holds no `{` or `}`."""
    return prefix if "{" in part or "}" in part else prefix.replace("f", "").replace("F", "")


def _alone(stmt: cst.BaseStatement) -> cst.BaseStatement:
    """The statement without the comments above it and after it, a compound one with `pass` for a body."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return stmt.with_changes(leading_lines=(), trailing_whitespace=cst.TrailingWhitespace())
    parts = {"orelse": None} if hasattr(stmt, "orelse") else {}
    return stmt.with_changes(leading_lines=(), body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])]), **parts)


def _openable(node: cst.CSTNode) -> bool:
    """A call with arguments, a dict with elements, `a if c else b`, or a list/dict/set comprehension."""
    return bool(_items(node)) or isinstance(node, (cst.IfExp, *_COMPREHENSIONS))


_COMPREHENSIONS = (cst.ListComp, cst.DictComp, cst.SetComp)


def _items(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
    """The arguments of a call, the elements of a dict literal (nothing for other nodes)."""
    if isinstance(node, cst.Call):
        return node.args
    return node.elements if isinstance(node, cst.Dict) else ()


def _opening_width(node: cst.CSTNode, start: int) -> int:
    """The width of the line that ends with the node's opening bracket once it is opened."""
    if not isinstance(node, cst.Call):
        return start + 1  # `{`, `[` or `(`
    return start + len(_code_of_node(node.func)) + len(_code_of_node(node.whitespace_after_func)) + 1


def _closes_the_line(rest: str) -> bool:
    """Is what follows a call on its line only closing brackets, a comma or a colon (and a comment)?
    Opening a call inside a longer expression (`f(x) if c else g(y)`) would not read like black."""
    return not rest.split("#", 1)[0].strip().strip(")]},:")


def _opened(node: cst.CSTNode, indent: str, step: str) -> cst.CSTNode:
    """A call or dict with one item a line, one step deeper than `indent`, and a trailing comma
    (none after a call's bare generator argument, where it would not parse); `a if c else b` in
    brackets, a part a line; a comprehension's element and its `for` on lines of their own."""
    inner = indent + step
    if isinstance(node, cst.IfExp):
        return _conditional_opened(node, indent, inner)
    if isinstance(node, _COMPREHENSIONS):
        return _comprehension_opened(node, indent, inner)
    items = list(_items(node))
    last = len(items) - 1
    laid_out = []
    for index, item in enumerate(items):
        closing = _line_break(indent if index == last else inner)
        if index == last and isinstance(item, cst.Arg) and isinstance(item.value, cst.GeneratorExp) and not item.value.lpar:
            laid_out.append(item.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=closing))
        elif isinstance(item, cst.Arg):
            laid_out.append(item.with_changes(comma=cst.Comma(whitespace_after=closing), whitespace_after_arg=cst.SimpleWhitespace("")))
        else:
            laid_out.append(item.with_changes(comma=cst.Comma(whitespace_after=closing)))
    if isinstance(node, cst.Call):
        return node.with_changes(whitespace_before_args=_line_break(inner), args=laid_out)
    return node.with_changes(lbrace=cst.LeftCurlyBrace(whitespace_after=_line_break(inner)),
                             rbrace=cst.RightCurlyBrace(), elements=laid_out)


def _comprehension_opened(node: cst.ListComp | cst.DictComp | cst.SetComp, indent: str, inner: str) -> cst.CSTNode:
    opening, closing = ("lbracket", "rbracket") if isinstance(node, cst.ListComp) else ("lbrace", "rbrace")
    return node.with_changes(**{
        opening: getattr(node, opening).with_changes(whitespace_after=_line_break(inner)),
        closing: getattr(node, closing).with_changes(whitespace_before=_line_break(indent)),
        "for_in": node.for_in.with_changes(whitespace_before=_line_break(inner)),
    })


def _conditional_opened(node: cst.IfExp, indent: str, inner: str) -> cst.IfExp:
    lpar, rpar = (node.lpar[0], node.rpar[-1]) if node.lpar else (cst.LeftParen(), cst.RightParen())
    return node.with_changes(
        lpar=[lpar.with_changes(whitespace_after=_line_break(inner)), *node.lpar[1:]],
        rpar=[*node.rpar[:-1], rpar.with_changes(whitespace_before=_line_break(indent))],
        whitespace_before_if=_line_break(inner),
        whitespace_before_else=_line_break(inner),
    )


def _line_break(indent: str) -> cst.ParenthesizedWhitespace:
    """A line break inside brackets, then the block's indentation and `indent` more."""
    return cst.ParenthesizedWhitespace(first_line=cst.TrailingWhitespace(), empty_lines=[], indent=True,
                                       last_line=cst.SimpleWhitespace(indent))


def _code_of(stmt: cst.BaseStatement) -> str:
    return code_of(cst.Module(body=[stmt]))


def _code_of_node(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)
