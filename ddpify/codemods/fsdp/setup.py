"""Process-group setup for a sharded model: DDP's, with a teardown that has no DDP wrapper to release."""

from __future__ import annotations

from ddpify.codemods.ddp.runtime import SHARDED_CLEANUP
from ddpify.codemods.ddp.setup import DistributedSetup


class ShardedSetup(DistributedSetup):
    """Join the process group (torchrun env, nccl/gloo) and leave it at the end."""

    CLEANUP = SHARDED_CLEANUP
