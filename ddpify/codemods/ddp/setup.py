"""Transform 1: process-group setup from torchrun's environment, and teardown at the end."""

from __future__ import annotations

import ast

from ddpify.anatomy import MODULE_SCOPE, Anatomy
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import CLEANUP_CALL, DDP_CLEANUP, RELEASE_COMMENT, SETUP_CALL, SETUP_HELPER
from ddpify.edits.positions import last_leading_import
from ddpify.edits.statements import enclose


class DistributedSetup(Transform):
    """Join the process group (torchrun env, nccl/gloo) and leave it at the end."""

    NAME = "setup"
    CLEANUP = DDP_CLEANUP  # the teardown helper: DDP's releases its wrappers first

    def plan(self) -> None:
        tree = self.anatomy.tree
        anchor = last_leading_import(tree)
        if anchor is None:
            self.missing(1, "no process group is joined (no top-level `import torch` to put the setup after)",
                         "add the distributed setup (init_process_group) by hand")
            return
        if "gc." in self.CLEANUP:
            self.add_import("gc")
        self.add_import("os")
        self.add_import("torch")
        self.add_import("torch.distributed", asname="dist")
        self.insert_after(anchor, SETUP_HELPER + self.CLEANUP)
        self.leave_room_for_helpers_after(anchor)
        self.changed(anchor.lineno, "added distributed helpers (RANK, LOCAL_RANK, WORLD_SIZE, RANK_DEVICE, setup/cleanup)")
        guard = self.anatomy.main_guard
        if guard is not None and not _needs_group_at_import(self.anatomy):
            self.insert_at_body_start(guard, SETUP_CALL)
            self._leave_in_finally(guard)
            self.changed(guard.lineno, "join the process group at start-up and leave it at exit, in the __main__ block")
            return
        self.insert_after(anchor, SETUP_CALL)
        if guard is not None:
            self._leave_in_finally(guard)
            self.changed(anchor.lineno, "join the process group after the imports (module-level code wraps or shards with it); leave it at the end of the __main__ block")
        else:
            self.append_to_module("\n" + self._cleanup())
            self.changed(anchor.lineno, "join the process group after the imports; leave it at the end of the script")

    def _cleanup(self) -> str:
        """The teardown call, after releasing the wrappers module-level code keeps in globals."""
        return self._release() + CLEANUP_CALL

    def _release(self) -> str:
        names = _global_models(self.anatomy)
        return f"{RELEASE_COMMENT}del {', '.join(names)}\n" if names else ""

    def _leave_in_finally(self, guard: ast.If) -> None:
        """The `__main__` block's statements run in `try:`, the teardown in `finally:`, so a crash
        still leaves the process group."""
        compound = f"try:\n    pass\nfinally:\n    {CLEANUP_CALL}"
        release = self._statements(self._release())
        for stmt in guard.body:
            self.group_statement(stmt, ("cleanup", guard.lineno), lambda run: enclose([*run, *release], compound))


def _global_models(anatomy: Anatomy) -> list[str]:
    """Trained models bound by statements of the module's own body (or its `__main__` block)."""
    bodies = [anatomy.tree.body] + ([anatomy.main_guard.body] if anatomy.main_guard is not None else [])
    names = [
        model.target.name for model in anatomy.trained_models
        if model.target.scope == MODULE_SCOPE and any(model.stmt in body for body in bodies)
    ]
    return list(dict.fromkeys(names))


def _needs_group_at_import(anatomy: Anatomy) -> bool:
    """Is a trained model or a training loader built at module level, outside the `__main__` block?

    Its DDP wrap or DistributedSampler runs at import, so the group must be joined before it.
    """
    sites = [*anatomy.trained_models, *anatomy.train_loaders]
    return any(anatomy.runs_at_import(site.stmt) for site in sites)
