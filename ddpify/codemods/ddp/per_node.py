"""Per-node duties: a download runs once per disk, before the other ranks read it.

Every rank downloading the same dataset into the same directory races (half-written archives,
corrupt extractions). The statement that downloads runs first on rank 0, then on each other node's
local rank 0, then on the remaining ranks, each group waiting at a barrier for the one before: the
later ones find the files and skip the download. So nodes whose disks are their own each fetch
their copy, and nodes that share a filesystem fetch one, never two at once into the same files.
A download streamed in `with` blocks, or skipped by an `if` that checks whether its files exist,
runs whole: a barrier inside the `if` would be met only by the ranks that found no files.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import MODULE_SCOPE, Anatomy
from ddpify.anatomy.distributed.launch import download_unit, downloads
from ddpify.anatomy.distributed.ranks import rank_guarded
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import LOCAL_RANK, RANK, SETUP_CALL
from ddpify.codemods.options import Options


class PerNodeDownloads(Transform):
    """Downloads run on rank 0 first, then on the other nodes' local rank 0, then on the rest."""

    NAME = "per-node"
    SEES_EDITS_OF = ("setup", "rank0")  # the setup call before, rank-0 guards around
    # What goes around the download, and the call that joins the process group (module-level code runs after it).
    WAIT = (f"if {RANK} != 0:\n    dist.barrier()  # rank 0 downloads first\n"
            f"if {LOCAL_RANK} != 0:\n    dist.barrier()  # then each node's local rank 0 (its own disk)\n")
    RELEASE = (f"if {RANK} == 0:\n    dist.barrier()  # other nodes find the files on a shared disk\n"
               f"if {LOCAL_RANK} == 0:\n    dist.barrier()  # the node's other ranks now find the files\n")
    JOINS_GROUP = SETUP_CALL.strip().rstrip("()")

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return bool(downloads(anatomy))  # the user's; no transform adds one

    def plan(self) -> None:
        done: set[ast.stmt] = set()
        for call in downloads(self.anatomy):
            stmt = download_unit(self.anatomy, call.stmt)  # with its `if not os.path.exists(...)` test
            if stmt in done or rank_guarded(self.anatomy, call.node):
                continue
            done.add(stmt)
            if not self._group_joined_before(stmt):
                self.advise(call.line, "download on every rank before the process group exists: run it on rank 0 first, then on each node's local rank 0, by hand")
                continue
            self.insert_before(stmt, self.WAIT)
            self.insert_after(stmt, self.RELEASE)
            self.changed(call.line, "download on rank 0 first, then on each other node's local rank 0 (once per disk); the other ranks wait, then reuse it")

    def _group_joined_before(self, stmt: ast.stmt) -> bool:
        """Code in functions runs after the __main__ block joins; module-level code after a setup call."""
        if self.anatomy.scope_of.get(stmt, MODULE_SCOPE) != MODULE_SCOPE:
            return True
        return any(c.qualname == self.JOINS_GROUP and c.scope == MODULE_SCOPE and c.line < stmt.lineno for c in self.anatomy.calls)
