"""Edits the DP transforms share: drop a statement but keep its comments."""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import Anatomy
from ddpify.codemods.base import Transform
from ddpify.edits.statements import one_statement_a_line

def remove_statement(transform: Transform, anatomy: Anatomy, stmt: ast.stmt, note: str = "") -> None:
    """Drop `stmt`; the comments and blank lines above it (and `note`, a comment saying why) move to
    the statement after it. The others of a line it shares (`a; b`) stay, one a line, as the lint's fix leaves them."""
    block = anatomy.block_of(stmt)
    line = _sharing_its_line(block, stmt)
    if len(line) > 1:
        index = line.index(stmt)
        transform.rewrite_statement(line[0], lambda holder: [s for i, s in enumerate(one_statement_a_line(holder)) if i != index])  # type: ignore[arg-type]
        return
    following = block[block.index(stmt) + 1]
    kept: list[cst.EmptyLine] = []
    why = [cst.EmptyLine(comment=cst.Comment(note))] if note else []

    def drop(removed: cst.BaseStatement) -> list[cst.BaseStatement]:
        kept.extend([*getattr(removed, "leading_lines", ()), *why])
        return []

    def take_comments(after: cst.BaseStatement) -> list[cst.BaseStatement]:
        return [after.with_changes(leading_lines=[*kept, *after.leading_lines])]  # type: ignore[attr-defined]

    transform.rewrite_statement(stmt, drop)
    transform.rewrite_statement(following, take_comments)


def _sharing_its_line(block: list[ast.stmt], stmt: ast.stmt) -> list[ast.stmt]:
    """The statements of `block` on the line of simple statements that holds `stmt` (`a; b`): each
    starts on the line where the one before it ends."""
    start = end = block.index(stmt)
    while start > 0 and block[start].lineno == block[start - 1].end_lineno:
        start -= 1
    while end + 1 < len(block) and block[end + 1].lineno == block[end].end_lineno:
        end += 1
    return block[start:end + 1]
