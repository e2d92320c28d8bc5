"""Statement-level CST builders: parse inserted code, guard or enclose statements, put statements
first in a body, spread `a; b` one statement a line, keep a replaced statement's comments."""

from __future__ import annotations

import ast
import functools
from typing import Callable, Iterator, Sequence

import libcst as cst

StatementRewrite = Callable[[cst.BaseStatement], Sequence[cst.BaseStatement]]


def parse_statements(code: str) -> list[cst.BaseStatement]:
    """CST statements from source text (used for inserted code); leading comments stay attached."""
    return list(_parsed_statements(code))


@functools.lru_cache(maxsize=1024)
def _parsed_statements(code: str) -> tuple[cst.BaseStatement, ...]:
    """Parsed once per text: conversions insert the same few snippets again and again (LibCST nodes
    are immutable, so one parse can serve every insertion)."""
    module = cst.parse_module(code)
    body = list(module.body)
    if body and module.header:
        body[0] = body[0].with_changes(leading_lines=[*module.header, *body[0].leading_lines])
    return tuple(body)


def guard(stmts: Sequence[cst.BaseStatement], condition: str) -> cst.If:
    """`if <condition>:` around statements, keeping the first one's comments above the `if`."""
    return enclose(stmts, f"if {condition}:\n    pass\n")  # type: ignore[return-value]


def enclose(stmts: Sequence[cst.BaseStatement], compound: str) -> cst.BaseCompoundStatement:
    """The compound statement `compound` (whose first body is `pass`) with `stmts` as that body,
    keeping the first statement's comments above the compound."""
    first = stmts[0]
    leading = getattr(first, "leading_lines", ())
    body = [first.with_changes(leading_lines=()) if leading else first, *stmts[1:]]  # type: ignore[attr-defined]
    header = parse_statements(compound)[0]
    return header.with_changes(body=cst.IndentedBlock(body=body), leading_lines=leading)  # type: ignore[return-value]


def first_in_body(compound: cst.BaseStatement, stmts: Sequence[cst.BaseStatement]) -> cst.BaseStatement:
    """`compound` with `stmts` as the first statements of its body (after a docstring); a body on
    its header line (`for x in y: a; b`) is spread out first, one statement a line."""
    block = getattr(compound, "body", None)
    if isinstance(block, cst.SimpleStatementSuite):
        block = cst.IndentedBlock(body=one_statement_a_line(block))
    if not isinstance(block, cst.IndentedBlock):
        return compound
    head = 1 if block.body and _is_docstring(block.body[0]) else 0
    return compound.with_changes(body=block.with_changes(body=[*block.body[:head], *stmts, *block.body[head:]]))  # type: ignore[attr-defined]


def one_statement_a_line(holder: cst.SimpleStatementLine | cst.SimpleStatementSuite) -> list[cst.BaseStatement]:
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


def names_bound(stmt: cst.BaseStatement) -> Iterator[str]:
    """The names a statement binds in its scope: its assignments' targets, a def's or class's name, a
    `for`'s target, `with ... as`, `except ... as` and imports, in its blocks too (not in a def's body)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        yield stmt.name.value
        return
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            yield from _small_statement_binds(small)
        return
    targets = [getattr(stmt, "target", None), *(item.asname for item in getattr(stmt, "items", ()) if item.asname)]
    targets += [handler.name for handler in getattr(stmt, "handlers", ()) if handler.name]
    for target in targets:
        yield from _target_names(target)
    for suite in _blocks(stmt):
        if isinstance(suite, cst.IndentedBlock):
            for inner in suite.body:
                yield from names_bound(inner)
        else:
            for small in suite.body:
                yield from _small_statement_binds(small)


def _small_statement_binds(small: cst.BaseSmallStatement) -> Iterator[str]:
    if isinstance(small, cst.Assign):
        for target in small.targets:
            yield from _target_names(target.target)
    elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
        yield from _target_names(small.target)
    elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
        for alias in small.names:
            bound = alias.asname.name if alias.asname else alias.name
            yield from _target_names(bound if isinstance(bound, cst.Name) else _first_name(bound))


def _target_names(target: cst.CSTNode | None) -> Iterator[str]:
    """The names an assignment target binds (`a`, `a, (b, *c)`; an attribute or a subscript binds none)."""
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _target_names(element.value)
    elif isinstance(target, (cst.AsName, cst.StarredElement)):
        yield from _target_names(target.name if isinstance(target, cst.AsName) else target.value)


def _first_name(dotted: cst.BaseExpression) -> cst.Name:
    """`a` of `import a.b.c`, which binds `a`."""
    while isinstance(dotted, cst.Attribute):
        dotted = dotted.value
    return dotted  # type: ignore[return-value]


def _blocks(stmt: cst.BaseStatement) -> list[cst.BaseSuite]:
    """Every block of a compound statement: its body, handlers, cases, else and finally, and its elifs'."""
    blocks = [getattr(stmt, "body", None), *(part.body for part in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())))]
    orelse, finalbody = getattr(stmt, "orelse", None), getattr(stmt, "finalbody", None)
    if isinstance(orelse, cst.If):
        return [block for block in blocks if block is not None] + _blocks(orelse)
    blocks += [part.body for part in (orelse, finalbody) if part is not None]
    return [block for block in blocks if block is not None]


def keep_leading_lines(old: cst.BaseStatement, new: cst.BaseStatement) -> cst.BaseStatement:
    """Comments and blank lines above a replaced statement stay above its replacement."""
    leading = getattr(old, "leading_lines", None)
    if leading is None or not hasattr(new, "leading_lines") or new.leading_lines:  # type: ignore[attr-defined]
        return new
    return new.with_changes(leading_lines=leading)  # type: ignore[attr-defined]


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def compound_bodies(node: cst.BaseCompoundStatement, stmt: ast.stmt) -> list[tuple[cst.BaseSuite, Sequence[ast.stmt]]]:
    """The bodies of a compound statement, each with its ast statements: body, except handlers,
    match cases, else, finally, and those of the `elif`s it leads."""
    if isinstance(node, cst.Match):
        pairs = [(case.body, ast_case.body) for case, ast_case in zip(node.cases, stmt.cases)]  # type: ignore[attr-defined]
    else:
        pairs = [(node.body, stmt.body)]  # type: ignore[attr-defined]
        pairs += [(handler.body, ast_handler.body) for handler, ast_handler in zip(getattr(node, "handlers", ()), getattr(stmt, "handlers", ()))]
    orelse, finalbody = getattr(node, "orelse", None), getattr(node, "finalbody", None)
    if orelse is not None and not isinstance(orelse, cst.If):
        pairs.append((orelse.body, stmt.orelse))  # type: ignore[attr-defined]
    if finalbody is not None:
        pairs.append((finalbody.body, stmt.finalbody))  # type: ignore[attr-defined]
    return pairs + compound_bodies(orelse, stmt.orelse[0]) if isinstance(orelse, cst.If) else pairs  # type: ignore[attr-defined]
