"""Noise drawn for the training batch, drawn alike by the reference and the ranks.

A GAN draws its noise for each step with as many rows as the batch its loader just gave
(`torch.randn(batch_size, nz, 1, 1)`): under DDP each rank draws rows for its part of the batch (the
converter seeds each rank apart), the reference for the whole, so the runs could only be compared
statistically, which a GAN's few steps cannot settle. Here the k-th such draw of either run (torch's `randn`,
`rand`, `randn_like`, `rand_like`, numpy.random's `normal`, `uniform`, `standard_normal`, `random`,
`random_sample`, `randn`, `rand` with parameters that are numbers, while training: a WGAN-GP's interpolation
weights `np.random.random((batch, 1, 1, 1))`) comes from a generator seeded by k: the reference
draws its N x b rows, each of the N ranks draws the same N x b rows and keeps its own b, the rows of its
part of the reference's batch. The law of the numbers is unchanged, only which numbers; the recorder
fingerprints the whole N x b draw in both runs, so compare sees that every rank drew the reference's
numbers and keeps the comparison exact. A draw of any other shape, or of numpy's with parameters given per
row (`np.random.normal(mu_array, 1)`), is left alone; so are numpy's `default_rng()` generators (not watched).

Imports torch and the standard library only (the harness loads it; numpy is reached through the draw's module).
"""

from __future__ import annotations

import numbers

import torch
from torch.utils.data.dataloader import _BaseDataLoaderIter

SEED = 0x5EED
NOISE = {draw.__name__: draw for draw in (torch.randn, torch.rand)}  # each also stands for its `_like` form
# numpy.random's noise: how many parameters of its law come before `size` (None: its arguments are the dims)
NUMPY_NOISE = {"normal": 2, "uniform": 2, "standard_normal": 0, "random": 0, "random_sample": 0, "randn": None, "rand": None}


class TrainingBatch:
    """Rows (dim 0) of the last batch a loader gave while autograd records, and how many batch-shaped draws
    this process has made."""

    rows: int | None = None
    draws = 0


def seed_torch(seed: int) -> None:
    """torch.manual_seed(seed) for the CPU generator, and CUDA's where CUDA has started. Before it starts,
    torch.manual_seed queues the seed for CUDA, MTIA and XPU and formats the stack for each: 1-2 ms a call,
    which per-sample seeding paid for every sample of every batch."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


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


def batch_shaped_draw(owner, name: str, args: tuple, kwargs: dict, drawn, world: int, rank: int) -> tuple | None:
    """(what this process gets, the whole draw of the N ranks) for `owner.name(*args, **kwargs)` (owner: torch or
    numpy.random) that drew `drawn` with the training batch's rows (`world`: the ranks whose rows the whole holds,
    1 for the reference; `rank`: this one), or None to keep `drawn`."""
    if owner is torch:
        return batch_shaped_noise(name, drawn, world, rank)
    return batch_shaped_numpy_noise(owner, name, args, kwargs, drawn, world, rank)


def batch_shaped_noise(name: str, drawn: torch.Tensor, world: int, rank: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """batch_shaped_draw for a torch `name` draw."""
    noise = NOISE.get(name.removesuffix("_like"))
    if noise is None or not torch.is_tensor(drawn) or not _training_rows(drawn) or not drawn.is_floating_point():
        return None
    with torch.random.fork_rng(devices=[]):
        seed_torch(_next_seed())
        whole = noise(world * drawn.shape[0], *drawn.shape[1:], dtype=drawn.dtype).to(drawn.device)
    return _own_rows(whole, rank, drawn.shape[0]).clone().requires_grad_(drawn.requires_grad), whole


def batch_shaped_numpy_noise(random, name: str, args: tuple, kwargs: dict, drawn, world: int, rank: int) -> tuple | None:
    """batch_shaped_draw for a `numpy.random.name` draw (`random`: numpy.random), redrawn by name from a RandomState
    with the same parameters where they are numbers."""
    if name not in NUMPY_NOISE or not _training_rows(drawn):
        return None
    leading = NUMPY_NOISE[name]
    parameters, keywords = args[:leading or 0], {key: value for key, value in kwargs.items() if key != "size"}
    if not all(isinstance(value, numbers.Real) for value in (*parameters, *keywords.values())):
        return None
    shape = (world * drawn.shape[0], *drawn.shape[1:])
    draw = getattr(random.RandomState(_next_seed()), name)
    whole = draw(*shape) if leading is None else draw(*parameters, size=shape, **keywords)
    return _own_rows(whole, rank, drawn.shape[0]).copy(), whole


def _training_rows(drawn) -> bool:
    """Has `drawn` (a tensor or numpy array) as many rows (dim 0) as the last training batch?"""
    shape = getattr(drawn, "shape", ())
    return len(shape) > 0 and shape[0] == TrainingBatch.rows


def _next_seed() -> int:
    """The seed of this process's next batch-shaped draw: the k-th draw's is SEED + k in every run."""
    TrainingBatch.draws += 1
    return SEED + TrainingBatch.draws


def _own_rows(whole, rank: int, rows: int):
    """This rank's `rows` rows of the whole draw (a view)."""
    return whole[rank * rows:(rank + 1) * rows]
