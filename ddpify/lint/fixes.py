"""Apply fixes to source text: all edits of a fix or none, skipping fixes that overlap earlier ones."""

from __future__ import annotations

import bisect
import re
from typing import Iterable

from ddpify.lint.rule import Edit, Fix

_LINE_END = re.compile(r"\r\n|\r|\n")


class LineIndex:
    """Converts (1-based line, 0-based character column) positions to offsets into the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in _LINE_END.finditer(text)]

    def offset(self, line: int, col: int) -> int:
        if not 1 <= line <= len(self.starts):
            raise ValueError(f"line {line} is outside the file (1..{len(self.starts)})")
        return min(self.starts[line - 1] + col, len(self.text))

    def position(self, offset: int) -> tuple[int, int]:
        """The (line, column) of an offset into the text."""
        line = bisect.bisect_right(self.starts, offset)
        return line, offset - self.starts[line - 1]

    def span(self, edit: Edit) -> tuple[int, int]:
        start, end = self.offset(edit.line, edit.col), self.offset(edit.end_line, edit.end_col)
        if end < start:
            raise ValueError(f"edit ends before it starts: {edit}")
        return start, end


def apply_fixes(text: str, fixes: Iterable[Fix]) -> tuple[str, int]:
    """Apply every fix that overlaps no fix taken before it (in source order); returns the new
    text and how many fixes were applied. The caller re-lints and fixes again for the rest."""
    index = LineIndex(text)
    taken: list[tuple[int, int, str]] = []
    applied = 0
    for spans in sorted(([(*index.span(e), e.text) for e in fix.edits] for fix in fixes if fix.edits), key=min):
        if not any(_overlap(s, t) for s in spans for t in taken):
            taken.extend(spans)
            applied += 1
    for start, end, new in sorted(taken, reverse=True):
        text = text[:start] + new + text[end:]
    return text, applied


def _overlap(a: tuple[int, int, str], b: tuple[int, int, str]) -> bool:
    """Two edits touch the same text, one inserts inside the text the other replaces, or both start
    at the same place (their order would be ambiguous)."""
    return a[0] == b[0] or (a[0] < b[1] and b[0] < a[1])
