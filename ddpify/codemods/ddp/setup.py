"""Transform 1: process-group setup from torchrun's environment, and teardown at the end."""

from __future__ import annotations

import ast

from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import CLEANUP_CALL, HELPERS, SETUP_CALL


class DistributedSetup(Transform):
    NAME = "setup"
    DESCRIPTION = "Join the process group (torchrun env, nccl/gloo) and leave it at the end."

    def plan(self) -> None:
        tree = self.anatomy.tree
        anchor = _last_leading_import(tree)
        if anchor is None:
            self.advise(1, "no top-level `import torch` found; add the distributed setup by hand")
            return
        self.add_import("os")
        self.add_import("torch")
        self.add_import("torch.distributed", asname="dist")
        self.insert_after(anchor, HELPERS)
        self.changed(anchor.lineno, "added distributed helpers (RANK, LOCAL_RANK, WORLD_SIZE, RANK_DEVICE, setup/cleanup)")
        guard = self.anatomy.main_guard
        if guard is not None:
            self.insert_at_body_start(guard, SETUP_CALL)
            self.insert_after(guard.body[-1], CLEANUP_CALL)
            self.changed(guard.lineno, "join the process group at start-up and leave it at exit, in the __main__ block")
        else:
            self.insert_after(anchor, SETUP_CALL)
            self.append_to_module("\n" + CLEANUP_CALL)
            self.changed(anchor.lineno, "join the process group after the imports; leave it at the end of the script")


def _last_leading_import(tree: ast.Module) -> ast.stmt | None:
    """The last import of the script's opening block of imports (docstring and imports)."""
    last = None
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            last = stmt
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and last is None:
            continue
        elif last is not None and not _is_trivial(stmt):
            break
    return last


def _is_trivial(stmt: ast.stmt) -> bool:
    """Statements that may sit between imports (try/except ImportError blocks count as imports)."""
    if isinstance(stmt, ast.Try):
        return all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in stmt.body)
    return False
