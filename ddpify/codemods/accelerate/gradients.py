"""The DDP target's gradient transforms, spelled with the Accelerator: accumulation micro-steps
under `accelerator.no_sync(model)`, a loss summed over the batch scaled by `accelerator.num_processes`.

The script's own accumulation stays as it is (its loss division and its step condition), so it
steps exactly as the original; Accelerator(gradient_accumulation_steps=...) with
`accelerator.accumulate(model)` would divide the loss again and step on its own count.
"""

from ddpify.codemods.accelerate.runtime import NO_SYNC, WORLD_SIZE
from ddpify.codemods.ddp.no_sync import NoSyncAccumulation
from ddpify.codemods.ddp.sum_loss import SumLossScaling


class AcceleratorNoSync(NoSyncAccumulation):
    """Skip the gradient all-reduce on accumulation micro-steps with accelerator.no_sync(model)."""

    def no_sync(self, model: str) -> str:
        return f"{NO_SYNC}({model})"


class AcceleratorSumLoss(SumLossScaling):
    """Scale a loss summed over the batch by accelerator.num_processes before backward."""

    WORLD_SIZE = WORLD_SIZE
