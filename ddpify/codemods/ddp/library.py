"""For a module the entry script imports: the rank names its converted code uses, never the process group.

Only the entry script joins and leaves the process group (`setup_distributed()`); a library module
runs at import time, so it gets just the constants its edits read (RANK, LOCAL_RANK, WORLD_SIZE,
RANK_DEVICE, computed from torchrun's environment) and the `dist` import, when it uses them.
"""

from __future__ import annotations

import ast

from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import RANK_CONSTANTS, RUNTIME_NAMES
from ddpify.edits.positions import last_leading_import


class LibraryRuntime(Transform):
    """Rank constants for an imported module's edits; the entry script alone joins the process group."""

    NAME = "setup"

    def plan(self) -> None:
        tree = self.anatomy.tree
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        if "dist" in read and "dist" not in bound and not self.anatomy.names.imports("torch.distributed"):
            self.add_import("torch.distributed", asname="dist")
        if not (set(RUNTIME_NAMES) & read) - bound:
            return
        self.add_import("os")
        self.add_import("torch")
        anchor = last_leading_import(tree)
        if anchor is not None:
            self.insert_after(anchor, RANK_CONSTANTS)
        else:
            self.insert_before(_first_statement(tree), RANK_CONSTANTS.lstrip("\n") + "\n")
        self.changed(anchor.lineno if anchor else 1, "added the rank constants (RANK, LOCAL_RANK, WORLD_SIZE, RANK_DEVICE); "
                     "the entry script joins the process group, not this imported module")


def _first_statement(tree: ast.Module) -> ast.stmt:
    body = tree.body
    docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
    return body[1] if docstring and len(body) > 1 else body[0]
