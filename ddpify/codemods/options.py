"""The conversion options a user chooses on the command line, read by the transforms."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Options:
    """What the user asked for on the command line."""

    batch_size: str = "per-gpu"  # or "global"
    eval: str = "shard"  # or "whole": every rank evaluates the full set
    log_loss: str = "reduced"  # or "rank0": training-loss prints show rank 0's shard only
    checkpoint: str = "full"  # --to fsdp: or "sharded": torch.distributed.checkpoint directories, a shard per rank
    mixed_precision: str = "keep"  # --to fsdp: or "policy": fully_shard(mp_policy=...) where the script autocasts
