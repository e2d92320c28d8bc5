"""Loaders for tests/test_verify_dealt_loaders.py, and (run under torchrun) what each rank's loader prepared
by Accelerate (Accelerator.prepare) gives: `dealt_loaders.py LOADERS_JSON PASSES` writes rank<N>.json, every pass's batches per loader."""

import json
import sys

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, WeightedRandomSampler


class Stream(IterableDataset):
    """The samples 0, 1, ..., count - 1, each a one-tensor tuple."""

    def __init__(self, count):
        self.count = count

    def __iter__(self):
        return ((torch.tensor(i),) for i in range(self.count))


def weighted(count):
    """`count` weighted draws with replacement from a generator of the sampler's own."""
    weights = torch.rand(count, generator=torch.Generator().manual_seed(5))
    return WeightedRandomSampler(weights, num_samples=count, replacement=True, generator=torch.Generator().manual_seed(1))


def loader(kind, count, batch, drop_last):
    """A loader over a stream of `count` samples, or over `count` samples drawn by a weighted sampler."""
    if kind == "stream":
        return DataLoader(Stream(count), batch_size=batch, drop_last=drop_last)
    return DataLoader(TensorDataset(torch.arange(count)), batch_size=batch, drop_last=drop_last, sampler=weighted(count))


def main(loaders, passes):
    from accelerate import Accelerator, DataLoaderConfiguration

    seen = {}
    for name, (kind, count, batch, drop_last, split) in loaders.items():
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=split))
        prepared = accelerator.prepare(loader(kind, count, batch, drop_last))
        seen[name] = [[rows[0].tolist() for rows in prepared] for _ in range(passes)]
    with open(f"rank{accelerator.process_index}.json", "w") as out:
        json.dump(seen, out)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]))
