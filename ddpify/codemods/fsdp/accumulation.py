"""Gradient accumulation under FSDP2: no reduce-scatter on micro-steps that do not step the optimizer.

FSDP2 has no `no_sync()`; its model says `set_requires_gradient_sync(flag)` before the forward, so
the micro-steps keep unsharded gradients locally and the stepping one reduce-scatters their sum.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import LoopSite
from ddpify.codemods.ddp.no_sync import NoSyncAccumulation


class GradientSyncAccumulation(NoSyncAccumulation):
    """Skip gradient reduce-scatter on accumulation micro-steps with set_requires_gradient_sync()."""

    NAME = "gradient_sync"

    def skip_sync(self, loop: LoopSite, statements: list[ast.stmt], model: str, condition: ast.expr) -> None:
        flag = ast.unparse(condition) if isinstance(condition, ast.Compare) else f"bool({ast.unparse(condition)})"
        self.insert_before(statements[0], f"{model}.set_requires_gradient_sync({flag})\n")
        self.changed(statements[0].lineno, f"accumulation micro-steps skip the gradient reduce-scatter: {model}.set_requires_gradient_sync() before the forward")
