"""The edit toolkit: LibCST edits at the positions the anatomy (built on `ast`) finds.

Shared by the convert transforms (`ddpify.codemods`), the lint fixes (`ddpify.lint.cst_fixes`)
and the rules (`rules/`), so a rule's fix and the transform that makes the same change build it
with one function. It sits above `ddpify.anatomy` and below everything that edits code:

- `positions`: the (line, column) key of a statement, the spans of a statement's CST nodes, and
  the last of a script's opening imports.
- `statements`: parse inserted code; guard, enclose, put first in a body, one statement a line.
- `expressions`: parse an expression; add or remove a keyword; the small rewrites a transform and
  a rule's fix share (`model.module`, `.mean()`, `.to(device)`, SyncBatchNorm, a seeded generator).
- `hoist`: fresh names, and a value hoisted out of a statement before the statement is guarded.
- `seeding`: the helper that seeds every RNG alike on every rank.
- `engine`: `Edits`, queued by position and made in one LibCST pass.
"""
