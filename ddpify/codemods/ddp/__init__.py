"""The DDP codemod: the transforms that turn a single-GPU script into a torchrun one, in order."""

from ddpify.codemods.ddp.batch_copies import NonBlockingBatchCopies
from ddpify.codemods.ddp.batch_draws import BatchesOfEachRank
from ddpify.codemods.ddp.devices import RankDevices
from ddpify.codemods.ddp.discarded_sync import NoSyncDiscardedGradients
from ddpify.codemods.ddp.environments import EnvironmentsOfEachRank
from ddpify.codemods.ddp.evaluation import EvaluationSharding, ReducedLossPrints
from ddpify.codemods.ddp.hand_gradients import HandAveragedGradients
from ddpify.codemods.ddp.library import LibraryRuntime
from ddpify.codemods.ddp.module_access import DDPModuleAccess
from ddpify.codemods.ddp.no_sync import NoSyncAccumulation
from ddpify.codemods.ddp.noise import NoiseOfEachRank
from ddpify.codemods.ddp.owned_optimizers import AveragedOwnedOptimizers
from ddpify.codemods.ddp.per_node import PerNodeDownloads
from ddpify.codemods.ddp.random_split import SameSplitOnEveryRank
from ddpify.codemods.ddp.rank_zero import RankZeroDuties
from ddpify.codemods.ddp.rows import RowsOfEachRank
from ddpify.codemods.ddp.samplers import DistributedSamplers
from ddpify.codemods.ddp.seeds import SeedBeforeShardedData, SeedWhereReproducibilityIsAskedFor
from ddpify.codemods.ddp.setup import DistributedSetup
from ddpify.codemods.ddp.sum_loss import SumLossScaling
from ddpify.codemods.ddp.wrap import RemoveDataParallel, WrapModel

DDP_TRANSFORMS = (
    DistributedSetup, SeedBeforeShardedData, SeedWhereReproducibilityIsAskedFor, RankDevices, NonBlockingBatchCopies, RemoveDataParallel, WrapModel, AveragedOwnedOptimizers, DDPModuleAccess, SameSplitOnEveryRank, NoiseOfEachRank,
    DistributedSamplers, RowsOfEachRank, HandAveragedGradients, BatchesOfEachRank, EnvironmentsOfEachRank, EvaluationSharding, ReducedLossPrints, RankZeroDuties, NoSyncAccumulation, NoSyncDiscardedGradients, SumLossScaling, PerNodeDownloads,
)


def library_transforms(transforms: tuple) -> tuple:
    """For a module the entry imports: the same edits, then rank constants instead of the process-group setup."""
    return tuple(t for t in transforms if not issubclass(t, (DistributedSetup, SeedBeforeShardedData, SeedWhereReproducibilityIsAskedFor))) + (LibraryRuntime,)


DDP_LIBRARY_TRANSFORMS = library_transforms(DDP_TRANSFORMS)
