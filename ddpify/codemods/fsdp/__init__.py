"""The FSDP2 codemod: the DDP conversion with the wrap and the checkpoints replaced.

Process group, devices, samplers and rank-0 duties are the DDP transforms themselves. FSDP2's
`fully_shard` keeps the model's own class, so nothing goes through `.module`; state dicts are
gathered whole on every rank (a collective) before rank 0 writes them.
"""

from ddpify.codemods.ddp import library_transforms
from ddpify.codemods.ddp.devices import RankDevices
from ddpify.codemods.ddp.per_node import PerNodeDownloads
from ddpify.codemods.ddp.rank_zero import RankZeroDuties
from ddpify.codemods.ddp.samplers import DistributedSamplers
from ddpify.codemods.ddp.sum_loss import SumLossScaling
from ddpify.codemods.ddp.wrap import RemoveDataParallel
from ddpify.codemods.fsdp.accumulation import GradientSyncAccumulation
from ddpify.codemods.fsdp.parameters import FullParameters
from ddpify.codemods.fsdp.seeds import SeedBeforeShard
from ddpify.codemods.fsdp.setup import ShardedSetup
from ddpify.codemods.fsdp.shard import ShardModel
from ddpify.codemods.fsdp.sharded_checkpoints import ShardedCheckpoints
from ddpify.codemods.fsdp.state_dicts import FullStateDicts
from ddpify.codemods.fsdp.whole_model import WholeShardedModel

FSDP_TRANSFORMS = (ShardedSetup, SeedBeforeShard, RankDevices, RemoveDataParallel, ShardModel, WholeShardedModel, ShardedCheckpoints, FullStateDicts, FullParameters, DistributedSamplers, RankZeroDuties,
                   GradientSyncAccumulation, SumLossScaling, PerNodeDownloads)
FSDP_LIBRARY_TRANSFORMS = library_transforms(FSDP_TRANSFORMS)
