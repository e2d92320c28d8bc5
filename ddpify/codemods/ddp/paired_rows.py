"""A loss term that pairs the batch's rows with each other stays each rank's own, with advice and a note.

Under DDP (FSDP, Accelerate) each rank pairs its own rows only (anatomy/batch_pairs.py): the conversion
trains, not identically. Whether to all-gather every rank's rows for the term or to keep the pairs within
each rank is the user's choice, so the term is left as it is: the advice names its line and both ways, and
the converted statement says it is kept per rank (a note above it), with a `# ddpify: ignore[DDP027]` after it
so that the output lints clean (DDP027 warns on such a term in a multi-GPU script the user wrote); the
suppression stays on its line even where the line outgrows the file's width (codemods/width.py). A term in a
compound statement's header gets the advice only: lint still reports it, a missing item.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy.batch_pairs import batch_pairs
from ddpify.codemods.base import Transform

SUPPRESSION = "# ddpify: ignore[DDP027]"
NOTE = ("# pairs each rank's own rows only (ddpify): to pair every row of the batch, "
        "all-gather them first with torch.distributed.nn.functional.all_gather")


def keep_pairs_per_rank(transform: Transform, world_size: str) -> None:
    """Advise on each term pairing the batch's rows, and note the statement it stands in."""
    noted: set[ast.stmt] = set()
    for pair in batch_pairs(transform.anatomy):
        transform.advise(pair.line, f"`{pair.code}` pairs the batch's rows with each other: each rank pairs its own rows only, "
                                    f"so the ranks' mean of this term misses the pairs across ranks and its gradient is not the "
                                    f"single-process one; to keep every pair, all-gather the rows first with the autograd-aware "
                                    f"torch.distributed.nn.functional.all_gather (torch.cat(all_gather(x))), or accept pairs "
                                    f"within each rank (a batch {world_size} times smaller for this term)")
        stmt = transform.anatomy.stmt_of[pair.node]
        if stmt not in noted:
            noted.add(stmt)
            transform.rewrite_in_place(stmt, _noted)


def _noted(stmt: cst.BaseStatement) -> cst.BaseStatement:
    """The statement with the note above it (after a comment of its own, moved up there) and the suppression
    after it."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return stmt  # a compound statement's header: lint still reports the term, left for the user
    own = stmt.trailing_whitespace.comment
    above = [cst.EmptyLine(comment=c) for c in (own, cst.Comment(NOTE)) if c is not None]
    trailing = stmt.trailing_whitespace.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(SUPPRESSION))
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, *above], trailing_whitespace=trailing)
