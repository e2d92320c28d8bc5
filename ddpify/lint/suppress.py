"""Suppression comments: `# ddpify: ignore[CODE, ...]`, `# ddpify: ignore`, `# noqa: CODE, ...`, `# noqa`.

A finding is suppressed by a directive on the first line of its range, or, when that line is part
of a simple statement spanning several lines, on the statement's last line (where a formatter
such as black leaves a trailing comment). Compound statements (`for`, `if`, `def`, ...) only count
their own first line, so a comment at the end of a block never silences the whole block.
Only real comments count (the file is tokenized), not text inside strings.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from typing import Iterable, Mapping

from ddpify.anatomy import Pos

ALL = None  # a directive without codes: every code on the line
Codes = frozenset[str] | None
_OUR_CODE = re.compile(r"^(?:DDP|DP)\d+$")

_DIRECTIVE = re.compile(
    r"#\s*(?:ddpify:\s*ignore(?:\[(?P<ddpify>[^\]]*)\])?|noqa(?::\s*(?P<noqa>[A-Za-z]+\d+(?:[,\s]+[A-Za-z]+\d+)*))?)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Directive:
    """One suppression comment: where it stands (`col` to `end_col` on `line`) and what it names."""

    line: int
    col: int
    end_col: int
    codes: Codes
    ours: bool  # `# ddpify: ignore...`, not `# noqa...` (which other linters read too)
    whole_comment: bool  # nothing else in the comment: removing it removes the comment


def directives(text: str) -> dict[int, Codes]:
    """Line -> codes its suppression comment names (ALL for a bare one); lines without are absent."""
    return by_line(directive_comments(text))


def by_line(found: Iterable[Directive]) -> dict[int, Codes]:
    """Line -> the codes its directives name together."""
    lines: dict[int, Codes] = {}
    for d in found:
        lines[d.line] = _merge(lines.get(d.line, frozenset()), d.codes)
    return lines


def directive_comments(text: str) -> list[Directive]:
    """Every suppression directive in the file's comments, in order."""
    lowered = text.lower()
    if "noqa" not in lowered and "ddpify" not in lowered:
        return []  # the common case, without tokenizing
    found = []
    for line, col, comment in _comments(text):
        for match in _DIRECTIVE.finditer(comment):
            whole = match.start() == 0 and match.end() == len(comment.rstrip())
            found.append(Directive(line, col + match.start(), col + match.end(), _codes_of(match),
                                   match.group(0).lstrip("#").strip().lower().startswith("ddpify"), whole))
    return found


def _comments(text: str) -> Iterable[tuple[int, int, str]]:
    """(line, column, text) of each comment."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return ((n, line.index("#"), line[line.index("#"):]) for n, line in enumerate(text.splitlines(), 1) if "#" in line)
    return ((tok.start[0], tok.start[1], tok.string) for tok in tokens if tok.type == tokenize.COMMENT)


def _codes_of(match: re.Match) -> Codes:
    listed = match.group("ddpify") if match.group("ddpify") is not None else match.group("noqa")
    if listed is None:
        return ALL
    codes = frozenset(c.upper() for c in re.split(r"[,\s]+", listed) if c)
    return codes or ALL


def _merge(a: Codes, b: Codes) -> Codes:
    return ALL if a is ALL or b is ALL else a | b


def statement_last_lines(tree: ast.AST) -> dict[int, int]:
    """For each line inside a multi-line simple statement, that statement's last line."""
    last: dict[int, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not hasattr(node, "body") and node.end_lineno and node.end_lineno > node.lineno:
            for line in range(node.lineno, node.end_lineno + 1):
                last[line] = node.end_lineno
    return last


def suppressing_line(code: str, pos: Pos, found: Mapping[int, Codes], last_lines: Mapping[int, int]) -> int | None:
    """The line whose directive covers `code` for a finding at `pos`: its first line, or its
    statement's last line; None when neither does."""
    for line in sorted({pos.line, last_lines.get(pos.line, pos.line)}):
        if line in found and (found[line] is ALL or code in found[line]):
            return line
    return None


def unused_directives(found: Iterable[Directive], used: Mapping[int, set[str]]) -> list[tuple[Directive, Codes]]:
    """Directives that suppressed nothing, each with its unused codes (ALL: a bare one, all of it).

    `used` maps a line to the codes whose findings its directive suppressed. Only what ddpify
    owns is judged: a `# ddpify: ignore...` comment, and ddpify codes in `# noqa: ...` (a bare
    `# noqa`, and other tools' codes, may serve another linter).
    """
    unused: list[tuple[Directive, Codes]] = []
    for d in found:
        if d.codes is ALL:
            if d.ours and not used.get(d.line):
                unused.append((d, ALL))
            continue
        idle = frozenset(c for c in d.codes if (d.ours or _OUR_CODE.match(c)) and c not in used.get(d.line, ()))
        if idle:
            unused.append((d, idle))
    return unused


def directive_text(d: Directive, codes: frozenset[str]) -> str:
    """The directive `d` naming `codes` only."""
    listed = ", ".join(sorted(codes))
    return f"# ddpify: ignore[{listed}]" if d.ours else f"# noqa: {listed}"


def add_directives(text: str, tree: ast.AST, findings: Iterable[tuple[str, Pos]]) -> tuple[str, int]:
    """`text` with a `# ddpify: ignore[CODE]` for each (code, position) finding, and how many lines
    gained or extended one. Each goes where `suppressing_line` looks (the statement's last line for a
    multi-line simple statement); a line that ends inside a string is left alone."""
    last_lines = statement_last_lines(tree)
    wanted: dict[int, set[str]] = {}
    for code, pos in findings:
        wanted.setdefault(last_lines.get(pos.line, pos.line), set()).add(code)
    lines = text.splitlines(keepends=True)
    inside = _lines_ending_in_strings(text)
    existing = {d.line: d for d in directive_comments(text) if d.ours and d.codes is not ALL}
    changed = 0
    for line, codes in wanted.items():
        if line in inside or not 0 < line <= len(lines) or lines[line - 1].rstrip().endswith("\\"):
            continue
        lines[line - 1] = _with_directive(lines[line - 1], codes, existing.get(line))
        changed += 1
    return "".join(lines), changed


def _with_directive(line: str, codes: set[str], present: Directive | None) -> str:
    if present is not None:
        merged = directive_text(present, present.codes | codes)  # type: ignore[operator]
        return line[: present.col] + merged + line[present.end_col:]
    body = line.rstrip("\r\n")
    return f"{body.rstrip()}  # ddpify: ignore[{', '.join(sorted(codes))}]{line[len(body):]}"


def _lines_ending_in_strings(text: str) -> set[int]:
    """Lines whose end lies inside a multi-line string (a comment there would change the string)."""
    inside: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0], tok.end[0]))
    except (tokenize.TokenError, SyntaxError):
        pass
    return inside
