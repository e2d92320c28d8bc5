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
from typing import Iterable, Mapping

from ddpify.anatomy import Pos

ALL = None  # a directive without codes: every code on the line
Codes = frozenset[str] | None

_DIRECTIVE = re.compile(
    r"#\s*(?:ddpify:\s*ignore(?:\[(?P<ddpify>[^\]]*)\])?|noqa(?::\s*(?P<noqa>[A-Za-z]+\d+(?:[,\s]+[A-Za-z]+\d+)*))?)",
    re.IGNORECASE,
)


def directives(text: str) -> dict[int, Codes]:
    """Line -> codes its suppression comment names (ALL for a bare one); lines without are absent."""
    lowered = text.lower()
    if "noqa" not in lowered and "ddpify" not in lowered:
        return {}  # the common case, without tokenizing
    found: dict[int, Codes] = {}
    for line, comment in _comments(text):
        for match in _DIRECTIVE.finditer(comment):
            found[line] = _merge(found.get(line, frozenset()), _codes_of(match))
    return found


def _comments(text: str) -> Iterable[tuple[int, str]]:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return ((n, line[line.index("#"):]) for n, line in enumerate(text.splitlines(), 1) if "#" in line)
    return ((tok.start[0], tok.string) for tok in tokens if tok.type == tokenize.COMMENT)


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


def is_suppressed(code: str, pos: Pos, found: Mapping[int, Codes], last_lines: Mapping[int, int]) -> bool:
    """Does a directive on the finding's first line, or its statement's last line, cover `code`?"""
    for line in {pos.line, last_lines.get(pos.line, pos.line)}:
        if line in found and (found[line] is ALL or code in found[line]):
            return True
    return False
