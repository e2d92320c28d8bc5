"""DDP022: a DDP forward in a loop whose number of iterations differs between ranks."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.names import DISTRIBUTED_SAMPLER
from ddpify.anatomy.distributed.samplers import loader_sampler
from ddpify.anatomy.distributed.wrappers import is_wrapper, wrap_calls
from ddpify.anatomy.evaluation import iterated_loaders
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._ddp import module_fix


class WrapperForwardInUnevenLoop(Rule, code="DDP022", name="wrapper-forward-in-uneven-loop", severity="error"):
    """## What it does
    Flags a forward of the DDP-wrapped model inside a loop over a DataLoader whose sampler is this
    rank's own share of the data, cut by the script (a function that returns this rank's indices),
    not by `DistributedSampler`: such shares differ in length when the set does not split
    evenly, so the ranks run the loop a different number of times. A set of one batch leaves a rank
    with nothing at all.

    ## Why is this bad?
    The wrapper's forward is a collective: it broadcasts rank 0's buffers (BatchNorm statistics)
    to every rank, even under `torch.no_grad()` and `model.eval()`, and on FSDP it all-gathers
    parameters. A rank with one batch more waits in that broadcast while the others have moved on
    to the next collective (the metric's all-reduce): the job hangs until the timeout kills it.
    `DistributedSampler` pads every rank to the same length, so its loops are never flagged.

    ## Example
    ```python
    val_loader = DataLoader(val_set, batch_size=64, sampler=my_share(len(val_set)))  # this rank's indices
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum()
    dist.all_reduce(correct)
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model.module(x).argmax(1) == y).sum()  # no collective in the forward
    dist.all_reduce(correct)
    ```
    (broadcast rank 0's buffers once before the loop if they must match), or give every rank the
    same number of batches.

    ## Fix safety
    Unsafe: the fix calls `model.module(...)`, which skips the wrapper's buffer broadcast; each rank
    then evaluates with its own BatchNorm statistics unless they are synchronised before the loop.
    """

    message = "DDP forward in a loop whose number of iterations differs between ranks: its buffer broadcast hangs the job"

    def check(self, a):
        if not wrap_calls(a):
            return
        for loop in _uneven_loops(a):
            for call in _wrapper_forwards(a, loop):
                yield Finding(a.pos(call), fix=module_fix(a, call.func, safe=False, description="call the module inside the DDP wrapper"))


def _uneven_loops(a) -> list[ast.For]:
    """`for` loops over a loader whose sampler is a rank's share that the script cuts itself."""
    return [
        node for node in a.nodes_of(ast.For)
        if any(_cut_by_hand(a, loader) for loader in iterated_loaders(a, node.iter))
    ]


def _cut_by_hand(a, loader) -> bool:
    sampler = loader_sampler(a, loader) if loader.call is not None else None
    return sampler is not None and a.qualname(sampler.func) != DISTRIBUTED_SAMPLER


def _wrapper_forwards(a, loop: ast.For) -> list[ast.Call]:
    return [
        node for stmt in loop.body for node in ast.walk(stmt)
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and is_wrapper(a, node.func)
    ]


_HEAD = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
data = TensorDataset(torch.randn(65, 4))
model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))


def my_share(size):
    per_rank = -(-size // world)
    return range(rank * per_rank, min((rank + 1) * per_rank, size))


"""

WrapperForwardInUnevenLoop.VALID = (
    _HEAD + "loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))\n"
    "with torch.no_grad():\n    for (x,) in loader:\n        model(x)\n",
    _HEAD + "loader = DataLoader(data, batch_size=8, sampler=my_share(len(data)))\n"
    "with torch.no_grad():\n    for (x,) in loader:\n        model.module(x)\n",
)
WrapperForwardInUnevenLoop.INVALID = (
    Invalid.fixed_by(
        _HEAD + "loader = DataLoader(data, batch_size=8, sampler=my_share(len(data)))\n"
        "with torch.no_grad():\n    for (x,) in loader:\n        out = model(x)\n",
        old="out = model(x)", new="out = model.module(x)",
    ),
)
