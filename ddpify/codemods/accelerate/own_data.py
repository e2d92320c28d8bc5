"""Training data that no loader deals, made each process's own with the Accelerator: the DDP target's
transforms (ddpify.codemods.ddp) with their edits spelled by ddpify.codemods.accelerate.spelled.

- batches drawn at random offsets (nanoGPT's `get_batch()`): the seed made again with
  `accelerator.process_index` added once the model is prepared (ddp/batch_draws.py);
- environments (reinforcement learning): each process's environment seeded with its index, the tests
  around each optimizer step agreed over the processes (ddp/environments.py);
- an optimizer a model builds over its own parameters and steps itself: rank 0's parameters broadcast
  and the gradients averaged by hand with `accelerator.reduce` (ddp/owned_optimizers.py), as prepare's
  DDP wrapper would.
"""

from ddpify.codemods.accelerate.prepare import PrepareForAccelerator
from ddpify.codemods.accelerate.spelled import SpelledWithTheAccelerator
from ddpify.codemods.ddp.batch_draws import BatchesOfEachRank
from ddpify.codemods.ddp.environments import EnvironmentsOfEachRank
from ddpify.codemods.ddp.owned_optimizers import AveragedOwnedOptimizers


class AcceleratorBatchDraws(SpelledWithTheAccelerator, BatchesOfEachRank):
    """Each process draws its own batches at random offsets: the seed made again with its index once the model is prepared."""

    SEES_EDITS_OF = (PrepareForAccelerator.NAME,)  # the prepare calls it reseeds after


class AcceleratorEnvironments(SpelledWithTheAccelerator, EnvironmentsOfEachRank):
    """An environment seeded per process, and the tests around each optimizer step agreed over the processes."""


class AcceleratorOwnedOptimizers(SpelledWithTheAccelerator, AveragedOwnedOptimizers):
    """Rank 0's parameters at the start and gradients averaged before each step, for each optimizer a class owns."""

    DUTY = PrepareForAccelerator.DUTY  # the same duty: every trained model's gradients averaged over the processes
