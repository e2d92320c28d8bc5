"""Plain BatchNorm in the reference, normalized part by part as the candidate's ranks do.

Under DDP (and FSDP) each of the N ranks normalizes its own part of the batch with that part's
statistics (SyncBatchNorm would not, but on CPU it cannot run). The aligned reference batch is
rank 0's samples, then rank 1's, and so on, every rank with as many (alignment.AlignedBatchSampler:
DistributedSampler pads the ranks to equal lengths), so the reference splits each input that
BatchNorm normalizes with batch statistics along dim 0 into N equal parts and normalizes each with
its own. The running statistics follow rank 0's part only: DDP broadcasts rank 0's buffers before
every forward (broadcast_buffers=True: DistributedDataParallel._sync_buffers, authoritative rank 0),
and rank 0 is the rank whose parameters are recorded. DataParallel's replicas get the parts
`Tensor.chunk` makes (3 + 2 for 5 samples on 2 replicas), and only replica 0 writes the original's
buffers (see dataparallel.py). An input that the ranks' batches cannot make up (not divisible by N)
is normalized whole and flagged: the runs are then compared statistically.

Imports torch only (the harness loads it).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

SPLIT_FLAG = "split_batchnorm"  # the record's flags: plain BatchNorm normalized per rank (detail: the class),
UNSPLIT_FLAG = "unsplit_batchnorm"  # and normalized whole, because the input does not split like the ranks' batches
Flag = Callable[[str, str], None]  # Recorder.flag


def rank_parts(batch: torch.Tensor, parts: int, equal: bool) -> tuple[torch.Tensor, ...] | None:
    """The parts of `batch` (dim 0) that `parts` ranks (`equal` sizes) or replicas (Tensor.chunk) each
    normalize; None when equal parts are asked for and the batch does not divide into them."""
    if equal and (batch.shape[0] < parts or batch.shape[0] % parts):
        return None
    return batch.chunk(parts)


def uses_batch_statistics(norm: _BatchNorm) -> bool:
    """Does this forward normalize with the batch's own statistics (training, or no running statistics)?"""
    return norm.training or (norm.running_mean is None and norm.running_var is None)


def normalize_batchnorm_per_rank(parts: int, equal: bool, flag: Flag) -> None:
    """Make every plain BatchNorm (SyncBatchNorm overrides forward) normalize each rank's part of the batch
    separately, updating its running statistics from the first part only; see the module docstring."""
    forward = _BatchNorm.forward

    def per_rank(self, input):
        if not uses_batch_statistics(self):
            return forward(self, input)
        chunks = rank_parts(input, parts, equal)
        if chunks is None:
            flag(UNSPLIT_FLAG, f"{type(self).__name__} normalized a batch of {input.shape[0]}, which {parts} ranks' "
                               f"equal parts cannot make up")
            return forward(self, input)
        flag(SPLIT_FLAG, type(self).__name__)
        first = forward(self, chunks[0])  # rank 0's part, which alone moves the running statistics
        rest = [F.batch_norm(chunk, None, None, self.weight, self.bias, True, 0.0, self.eps) for chunk in chunks[1:]]
        return torch.cat([first, *rest])

    _BatchNorm.forward = per_rank
