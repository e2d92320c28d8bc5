"""DDP011: `random_split` without a generator or a seed, in a script that runs a process per GPU."""

from __future__ import annotations

import ast

from ddpify.anatomy import syntax
from ddpify.anatomy.distributed.randomness import unseeded_random_splits
from ddpify.edits.expressions import with_seeded_generator
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit


class UnseededRandomSplit(Rule, code="DDP011", name="unseeded-random-split", severity="error"):
    """## What it does
    Flags `random_split(...)` in a DDP script when it has no `generator=` and no
    `torch.manual_seed(...)` (or `seed_everything`/`set_seed`, or a local function that calls
    one) has run before it.

    ## Why is this bad?
    Every rank runs the split, and an unseeded process draws its own: one rank's validation
    samples are another rank's training samples (leaked, optimistic validation scores), and the
    DistributedSampler shards a different dataset on each rank, so samples are seen twice or never.
    An error, as DDP023's other splits drawn per rank (`train_test_split`, shuffled index lists).

    An unseeded model is *not* a problem: DDP broadcasts rank 0's parameters and buffers when it
    wraps the model, and DistributedSampler shuffles with its own fixed seed.

    ## Example
    ```python
    dist.init_process_group("nccl")
    train_set, val_set = random_split(dataset, [0.9, 0.1])
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    train_set, val_set = random_split(dataset, [0.9, 0.1], generator=torch.Generator().manual_seed(0))
    ```

    ## Fix safety
    Unsafe: adds `generator=torch.Generator().manual_seed(0)`, which picks a different split
    than the one a single-GPU run drew.
    """

    message = ("wrong results: random_split without a generator or seed: each rank draws a different split, so one "
               "rank's validation samples are another rank's training samples")

    def check(self, a):
        for site in unseeded_random_splits(a):
            yield Finding(site.pos, fix=_fix(a, site.node))


def _fix(a, call: ast.Call) -> Fix | None:
    """`generator=torch.Generator().manual_seed(0)` added by convert's own builder."""
    torch = syntax.spelling(a, "torch")
    edit = expression_edit(a, call, lambda node: with_seeded_generator(node, torch)) if torch and call.args else None  # type: ignore[arg-type]
    return Fix((edit,), safe=False, description="draw the split from a seeded generator") if edit else None


_HEAD = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, random_split

dist.init_process_group("gloo")
data = TensorDataset(torch.arange(10))
"""

UnseededRandomSplit.VALID = (
    _HEAD + "train, val = random_split(data, [8, 2], generator=torch.Generator().manual_seed(0))\n",
    _HEAD + "torch.manual_seed(0)\ntrain, val = random_split(data, [8, 2])\n",
    _HEAD + """

def seed_everything(seed):
    torch.manual_seed(seed)


def main():
    seed_everything(0)
    train, val = random_split(data, [8, 2])
""",
    # an unseeded model is fine: DDP broadcasts rank 0's parameters when it wraps it
    _HEAD + "model = DDP(torch.nn.Linear(4, 1))\n",
)
UnseededRandomSplit.INVALID = (
    Invalid.fixed_by(_HEAD + "train, val = random_split(data, [8, 2])\n", old="[8, 2])", new="[8, 2], generator=torch.Generator().manual_seed(0))"),
    Invalid.fixed_by(
        _HEAD + "model = DDP(torch.nn.Linear(4, 1))\ntrain, val = random_split(\n    data,\n    [8, 2],\n)\ntorch.manual_seed(0)\n",
        old="    [8, 2],\n", new="    [8, 2],\n    generator=torch.Generator().manual_seed(0),\n", line=9,
    ),
)
