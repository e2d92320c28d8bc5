"""DDP005: a training DataLoader that every rank reads in full."""

from __future__ import annotations

from ddpify.anatomy.distributed.ranks import mentions_rank
from ddpify.anatomy.distributed.samplers import has_sampler_argument
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule


class LoaderWithoutDistributedSampler(
    Rule, code="DDP005", name="loader-without-distributed-sampler", severity="warning"
):
    """## What it does
    Flags a DataLoader that a training loop iterates, in a DDP script, when it has no `sampler=`
    or `batch_sampler=` and its dataset does not depend on the rank.
    Hugging Face Accelerate scripts are not checked: a loader handed to `accelerator.prepare` gets
    Accelerate's own sharding sampler, which gives each process its share of the batches.

    ## Why is this bad?
    Every rank then iterates the whole dataset: an epoch costs world-size times the work of a
    single-GPU epoch, the effective batch is world-size times larger than intended on the same
    samples, and "epochs" no longer mean what the schedule assumes. A `DistributedSampler` gives
    each rank its own 1/world-size shard.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    # and sampler.set_epoch(epoch) at the start of every epoch
    ```

    ## Fix safety
    No fix: adding a sampler also needs `set_epoch` calls and changes the number of steps per
    epoch, which learning-rate schedules may depend on.
    """

    message = "training DataLoader has no DistributedSampler: every rank trains on the whole dataset"

    def check(self, a):
        for loader in a.train_loaders:
            if has_sampler_argument(loader):
                continue
            dataset = syntax.argument(loader.call, 0, "dataset")
            if dataset is not None and mentions_rank(a, dataset):
                continue  # sharded by hand
            yield Finding(loader.pos)


_HEAD = """import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
"""
_LOOP = """for x, y in loader:
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    opt.step()
"""

LoaderWithoutDistributedSampler.VALID = (
    _HEAD + "loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data))\n" + _LOOP,
    # a shard picked by hand
    _HEAD + "rank, world = dist.get_rank(), dist.get_world_size()\n"
    "shard = Subset(data, range(rank, len(data), world))\nloader = DataLoader(shard, batch_size=2, shuffle=True)\n" + _LOOP,
    # an evaluation loader may be read in full on every rank
    _HEAD + "loader = DataLoader(data, batch_size=2)\nwith torch.no_grad():\n    for x, y in loader:\n        out = model(x)\n",
)
LoaderWithoutDistributedSampler.INVALID = (
    Invalid(_HEAD + "loader = DataLoader(data, batch_size=2, shuffle=True)\n" + _LOOP, line=9),
)
