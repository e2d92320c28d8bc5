"""DDP011: no seed before the model is built or the dataset is split."""

from __future__ import annotations

import ast

from ddpify.anatomy import distributed as ddp
from ddpify.lint import Edit, Finding, Fix, Invalid, Rule
from ddpify.rules._ddp import DDP_KINDS, insert_before

_RANDOM_SPLIT = "torch.utils.data.random_split"


class MissingSeed(Rule):
    """## What it does
    Flags a DDP script that builds its DDP-wrapped model, or splits its dataset with
    `random_split(...)` (without `generator=`), before any `torch.manual_seed(...)` (or
    `seed_everything`/`set_seed`, or a local function that calls one) has run.

    ## Why is this bad?
    Not what is often claimed: the initial weights do agree, because DDP broadcasts rank 0's
    parameters and buffers when it wraps the model, and DistributedSampler shuffles with its own
    fixed seed. What breaks is everything random that DDP does *not* broadcast:

    * `random_split` draws a different split on every rank, so one rank's validation samples are
      another rank's training samples (leaked, optimistic validation scores);
    * models or parameters outside the wrapper (an EMA copy, a teacher, a head created after
      wrapping) start different on each rank;
    * and no run can be reproduced.

    Seeding every rank with the same seed does make dropout masks and random augmentations
    identical across ranks; add the rank to the seed (`base_seed + rank`) for per-rank randomness
    after the model and the split are built.

    ## Example
    ```python
    dist.init_process_group("nccl")
    train_set, val_set = random_split(dataset, [0.9, 0.1])
    model = DDP(Net().to(rank), device_ids=[rank])
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    train_set, val_set = random_split(dataset, [0.9, 0.1])
    model = DDP(Net().to(rank), device_ids=[rank])
    ```

    ## Fix safety
    Unsafe: inserts `torch.manual_seed(0)` before the statement; that changes every random draw
    that follows.
    """

    code = "DDP011"
    name = "missing-seed"
    message = "no seed set before the model is built: runs are not reproducible and un-broadcast randomness differs per rank"
    severity = "warning"
    applies_to = DDP_KINDS

    def check(self, anatomy):
        a = anatomy
        splits = [c.node for c in a.calls_to(_RANDOM_SPLIT) if ddp.keyword(c.node, "generator") is None]
        for node in splits:
            if not _seeded_before(a, node):
                yield Finding(
                    a.pos(node),
                    "random_split without a seed: each rank draws a different split, so one rank's "
                    "validation samples are another rank's training samples",
                    _fix(a, node),
                )
        unseeded_splits = [s for s in splits if not _seeded_before(a, s)]
        models = sorted(ddp.wrapped_origins(a), key=lambda n: (n.lineno, n.col_offset))
        first = next((m for m in models if not _seeded_before(a, m)), None)
        if first is not None and not any(_precedes(a, s, first) for s in unseeded_splits):
            yield Finding(a.pos(first), fix=_fix(a, first))


def _seeded_before(a, node: ast.AST) -> bool:
    scope = ddp.enclosing_function(a, node)
    return any(
        ddp.enclosing_function(a, seed.node) != scope or seed.line < node.lineno  # type: ignore[attr-defined]
        for seed in ddp.seed_calls(a)
    )


def _precedes(a, first: ast.AST, then: ast.AST) -> bool:
    """Same function, earlier line: seeding before `first` (the fix) also covers `then`."""
    return ddp.enclosing_function(a, first) == ddp.enclosing_function(a, then) and first.lineno < then.lineno  # type: ignore[attr-defined]


def _fix(a, node: ast.AST) -> Fix | None:
    manual_seed = ddp.spelling(a, "torch.manual_seed")
    stmt = a.stmt_of.get(node)
    edit: Edit | None = insert_before(a, stmt, f"{manual_seed}(0)") if manual_seed and stmt is not None else None
    return Fix((edit,), safe=False, description="seed torch's generators first") if edit else None


_HEAD = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, random_split

dist.init_process_group("gloo")
"""

MissingSeed.VALID = (
    _HEAD + "torch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(4, 1))\n",
    _HEAD + """

def seed_everything(seed):
    torch.manual_seed(seed)


def main():
    seed_everything(0)
    model = DDP(torch.nn.Linear(4, 1))
""",
    _HEAD + "data = TensorDataset(torch.arange(10))\n"
    "train, val = random_split(data, [8, 2], generator=torch.Generator().manual_seed(0))\n",
)
MissingSeed.INVALID = (
    Invalid(
        _HEAD + "model = DDP(torch.nn.Linear(4, 1))\n",
        line=7,
        fixed=_HEAD + "torch.manual_seed(0)\nmodel = DDP(torch.nn.Linear(4, 1))\n",
    ),
    Invalid(
        _HEAD + "data = TensorDataset(torch.arange(10))\ntrain, val = random_split(data, [8, 2])\n",
        line=8,
        fixed=_HEAD + "data = TensorDataset(torch.arange(10))\ntorch.manual_seed(0)\ntrain, val = random_split(data, [8, 2])\n",
    ),
    Invalid(
        _HEAD + "net = torch.nn.Linear(4, 1)\ntorch.manual_seed(0)\nmodel = DDP(net)\n",
        line=7,
    ),
)
