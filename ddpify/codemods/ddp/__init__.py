"""The DDP codemod: the transforms that turn a single-GPU script into a torchrun one, in order."""

from ddpify.codemods.ddp.devices import RankDevices
from ddpify.codemods.ddp.rank_zero import RankZeroDuties
from ddpify.codemods.ddp.samplers import DistributedSamplers
from ddpify.codemods.ddp.setup import DistributedSetup
from ddpify.codemods.ddp.module_access import DDPModuleAccess
from ddpify.codemods.ddp.no_sync import NoSyncAccumulation
from ddpify.codemods.ddp.wrap import WrapModel

DDP_TRANSFORMS = (DistributedSetup, RankDevices, WrapModel, DDPModuleAccess, DistributedSamplers, RankZeroDuties, NoSyncAccumulation)
