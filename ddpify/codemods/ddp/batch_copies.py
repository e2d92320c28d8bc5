"""Transform: the copies of tensor batches onto the GPU do not wait for the GPU (`non_blocking=True`).

A blocking `x.to(device)` waits for the kernels already queued before it copies, every step; with
`non_blocking=True` it is queued behind them and the host goes on (ddpify.anatomy.batch_copies says
which copies are safe to make so). Measured on an H200 with two ranks sharing the GPU, the one fixture
whose original already copied this way ran at par with an expert's port, the others 9-32 % slower
(docs/performance.md, "On a GPU"). On CPU the option does nothing.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy.batch_copies import batch_copies
from ddpify.codemods.base import Transform
from ddpify.edits.expressions import add_keyword


class NonBlockingBatchCopies(Transform):
    """Add `non_blocking=True` to the host-to-GPU copies of a loader's tensor batches."""

    NAME = "non-blocking"
    SEES_EDITS_OF = ()

    @classmethod
    def finds_work(cls, anatomy, options) -> bool:
        return bool(anatomy.step_loops)

    def plan(self) -> None:
        for copy in batch_copies(self.anatomy):
            self.rewrite_node(copy, cst.Call, lambda call: add_keyword(call, "non_blocking", "True"))
            self.changed(copy.lineno, f"{ast.unparse(copy.func)}(..., non_blocking=True): "
                                      "the batch's copy to the GPU does not wait for the queued kernels")
