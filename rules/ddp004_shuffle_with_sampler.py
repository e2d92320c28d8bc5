"""DDP004: `shuffle=True` next to `sampler=` in a DataLoader."""

from __future__ import annotations

from ddpify.anatomy.distributed.samplers import has_sampler_argument
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._ddp import remove_keyword_fix


class ShuffleWithSampler(Rule, code="DDP004", name="shuffle-with-sampler", severity="error"):
    """## What it does
    Flags a `DataLoader(...)` given both `shuffle=True` and a `sampler=` (or `batch_sampler=`).
    Hugging Face Accelerate scripts are not checked: a loader handed to `accelerator.prepare` gets
    Accelerate's own sharding sampler, which takes the loader's `shuffle=` over.

    ## Why is this bad?
    The sampler decides the order; `DataLoader` refuses the combination with
    `ValueError: sampler option is mutually exclusive with shuffle` as soon as the line runs. With
    a `DistributedSampler`, pass `shuffle=True` to the sampler instead (its default).

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True, sampler=DistributedSampler(dataset))
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
    ```

    ## Fix safety
    Safe: drops `shuffle=True`; the line raised before, and a `DistributedSampler` shuffles by default.
    """

    message = "`shuffle=True` with `sampler=` raises ValueError; the sampler does the shuffling"

    def check(self, a):
        for loader in a.loaders:
            shuffle = syntax.keyword(loader.call, "shuffle")
            if shuffle is None or not syntax.constant(shuffle.value, True) or not has_sampler_argument(loader):
                continue
            yield Finding(a.pos(shuffle), fix=remove_keyword_fix(a, loader.call, shuffle, safe=True, description="drop `shuffle=True`"))


_HEAD = """import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
data = TensorDataset(torch.randn(8, 4))
"""

ShuffleWithSampler.VALID = (
    _HEAD + "loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=True))\n",
    _HEAD + "sampler = DistributedSampler(data) if dist.is_initialized() else None\n"
    "loader = DataLoader(data, shuffle=(sampler is None), sampler=sampler)\n",
    _HEAD + "loader = DataLoader(data, batch_size=2, shuffle=True, sampler=None)\n",
)
ShuffleWithSampler.INVALID = (
    Invalid.fixed_by(
        _HEAD + "loader = DataLoader(data, batch_size=2, shuffle=True, sampler=DistributedSampler(data))\n",
        old="shuffle=True, ", new="",
    ),
    Invalid.fixed_by(
        _HEAD + "sampler = DistributedSampler(data)\nloader = DataLoader(\n    data,\n    shuffle=True,\n    sampler=sampler,\n)\n",
        old="    shuffle=True,\n", new="",
    ),
    # the last argument: the one before it takes over the trailing comma
    Invalid(
        _HEAD + "loader = DataLoader(\n    data,\n    sampler=DistributedSampler(data),\n    shuffle=True,  # as before\n)\n",
        line=10,
        fixed=_HEAD + "loader = DataLoader(\n    data,\n    sampler=DistributedSampler(data),  # as before\n)\n",
    ),
)
