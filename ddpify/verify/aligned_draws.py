"""Noise drawn for the training batch, drawn alike by the reference and the ranks.

A GAN draws its noise for each step with as many rows as the batch its loader just gave
(`torch.randn(batch_size, nz, 1, 1)`): under DDP each rank draws rows for its part of the batch (the
converter seeds each rank apart), the reference for the whole, so the runs could only be compared
statistically, which a GAN's few steps cannot settle. Here the k-th such draw of either run (`randn`,
`rand`, `randn_like`, `rand_like` while training) comes from a generator seeded by k: the reference
draws its N x b rows, each of the N ranks draws the same N x b rows and keeps its own b, the rows of its
part of the reference's batch. The law of the numbers is unchanged, only which numbers; the recorder
fingerprints the whole N x b draw in both runs, so compare sees that every rank drew the reference's
numbers and keeps the comparison exact. A draw of any other shape is left alone.

Imports torch and the standard library only (the harness loads it).
"""

from __future__ import annotations

import torch
from torch.utils.data.dataloader import _BaseDataLoaderIter

SEED = 0x5EED
NOISE = {draw.__name__: draw for draw in (torch.randn, torch.rand)}  # each also stands for its `_like` form


class TrainingBatch:
    """Rows (dim 0) of the last batch a loader gave while autograd records, and how many batch-shaped draws
    this process has made."""

    rows: int | None = None
    draws = 0


def watch_training_batches() -> None:
    """Remember the rows of every batch a DataLoader gives while autograd records (a training loop's)."""
    next_batch = _BaseDataLoaderIter.__next__

    def watched(self):
        batch = next_batch(self)
        if torch.is_grad_enabled():
            TrainingBatch.rows = _rows(batch)
        return batch

    _BaseDataLoaderIter.__next__ = watched


def _rows(batch) -> int | None:
    """Dim 0 of the first tensor in a batch (a tensor, or a tuple, list or dict holding tensors)."""
    if torch.is_tensor(batch):
        return batch.shape[0] if batch.dim() else None
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
    return next((rows for rows in map(_rows, items) if rows is not None), None)


def batch_shaped_noise(name: str, drawn: torch.Tensor, world: int, rank: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(what this process gets, the whole draw of the N ranks) for a `name` draw of the training batch's rows
    (`world`: the ranks whose rows the whole holds, 1 for the reference), or None to keep `drawn`."""
    rows, noise = TrainingBatch.rows, NOISE.get(name.removesuffix("_like"))
    if noise is None or not torch.is_tensor(drawn) or not drawn.dim() or drawn.shape[0] != rows or not drawn.is_floating_point():
        return None
    TrainingBatch.draws += 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED + TrainingBatch.draws)
        whole = noise(world * rows, *drawn.shape[1:], dtype=drawn.dtype).to(drawn.device)
    own = whole[rank * rows:(rank + 1) * rows].clone().requires_grad_(drawn.requires_grad)
    return own, whole
