"""The DDP target's gradient transforms, spelled with the Accelerator: gradient accumulation under
`accelerator.accumulate(model)`, a loss summed over the batch scaled by `accelerator.num_processes`.

Accumulation becomes Accelerate's own where it is exactly the script's (ddpify.codemods.accelerate.
accumulation): `accelerator.gradient_accumulation_steps = N` before the loop, the micro-step's forward
to backward under `with accelerator.accumulate(model):`, the loss no longer divided by N (its backward
does it), the script's step condition kept (the prepared optimizer steps where it holds). Elsewhere
the script's own accumulation stays as it is, its micro-steps under `accelerator.no_sync(model)`.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import LoopSite
from ddpify.codemods.accelerate.accumulation import Accumulation, accelerate_accumulation
from ddpify.codemods.accelerate.runtime import ACCUMULATE, ACCUMULATION_STEPS, NO_SYNC, WORLD_SIZE
from ddpify.codemods.ddp.no_sync import NoSyncAccumulation
from ddpify.codemods.ddp.sum_loss import SumLossScaling
from ddpify.edits.statements import enclose


class AcceleratorNoSync(NoSyncAccumulation):
    """Accumulation micro-steps under accelerator.accumulate(model) where exact, accelerator.no_sync(model) elsewhere."""

    def skip_sync(self, loop: LoopSite, statements: list[ast.stmt], model: str, condition: ast.expr) -> None:
        taken = accelerate_accumulation(self.anatomy, loop, statements, condition)
        if isinstance(taken, str):
            super().skip_sync(loop, statements, model, condition)
            self.advise(loop.line, f"gradient accumulation kept as the script's own, not {ACCUMULATE}({model}): {taken}")
            return
        self._accumulate(loop, statements, model, taken)

    def _accumulate(self, loop: LoopSite, statements: list[ast.stmt], model: str, taken: Accumulation) -> None:
        steps = ast.unparse(taken.steps)
        self.insert_before(loop.node, f"{ACCUMULATION_STEPS} = {steps}\n")  # type: ignore[arg-type]
        for stmt in statements:
            self.group_statement(stmt, (ACCUMULATE, loop.line), lambda run: enclose(run, f"with {ACCUMULATE}({model}):\n    pass\n"))
        self.rewrite_expression(taken.division, lambda node: node.left)  # type: ignore[attr-defined]
        self.changed(statements[0].lineno, f"accumulation under {ACCUMULATE}({model}) with {ACCUMULATION_STEPS} = {steps}: "
                                           "one all-reduce per optimizer step, the loss divided by the backward")

    def no_sync(self, model: str) -> str:
        return f"{NO_SYNC}({model})"


class AcceleratorSumLoss(SumLossScaling):
    """Scale a loss summed over the batch by accelerator.num_processes before backward."""

    WORLD_SIZE = WORLD_SIZE
