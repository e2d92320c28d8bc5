"""DDP003: a shuffling DistributedSampler whose epoch never changes."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.samplers import bound_name, loader_sampler, sampler_shuffles, sets_epoch
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.rules._ddp import header_pos, insert_at_top_of_body


class SamplerWithoutSetEpoch(Rule, code="DDP003", name="sampler-without-set-epoch", severity="warning"):
    """## What it does
    Flags an epoch loop around a training loader whose `DistributedSampler` shuffles, when nothing
    in the loop (or in the functions it calls) calls `set_epoch(...)`.
    Hugging Face Accelerate scripts are not checked: a loader handed to `accelerator.prepare` gets
    Accelerate's own sharding sampler, which reshuffles every epoch by itself.

    ## Why is this bad?
    `DistributedSampler` seeds its shuffle with `seed + epoch`. Without `set_epoch(epoch)` the epoch
    stays 0, so every epoch visits the samples in the same order and every rank keeps the same
    shard: the shuffle is done once, not every epoch, which hurts convergence.

    ## Example
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...
    ```

    ## Fix safety
    Safe: inserts `<sampler>.set_epoch(<epoch>)` (or `<loader>.sampler.set_epoch(<epoch>)`) as the
    first statement of the epoch loop, which only changes the order the sampler yields. There is no
    fix when the loop has no loop variable, or neither the sampler nor the loader is bound to a
    name before the loop (a loader rebuilt inside the loop needs the call after it).
    """

    message = "DistributedSampler never gets `set_epoch(epoch)`: every epoch uses the same shuffle"

    def check(self, a):
        for loader in a.train_loaders:
            sampler = loader_sampler(a, loader)
            if sampler is None or not sampler_shuffles(sampler):
                continue
            for epoch_loop in a.epoch_loops_around(loader):
                if not sets_epoch(a, epoch_loop.node.body):
                    yield Finding(header_pos(a, epoch_loop.node), fix=_fix(a, epoch_loop, loader, sampler))


def _fix(a, epoch_loop, loader, sampler) -> Fix | None:
    if epoch_loop.loop_var is None:
        return None
    receiver = _visible_name(a, bound_name(a, sampler), epoch_loop.node)
    if receiver is None:
        loader_name = _visible_name(a, bound_name(a, loader.call), epoch_loop.node)
        receiver = f"{loader_name}.sampler" if loader_name else None
    if receiver is None:
        return None
    edit = insert_at_top_of_body(a, epoch_loop.node, f"{receiver}.set_epoch({epoch_loop.loop_var})")
    if edit is None:
        return None
    return Fix((edit,), safe=True, description=f"call `{receiver}.set_epoch({epoch_loop.loop_var})` at the start of each epoch")


def _visible_name(a, target: ast.AST | None, where: ast.AST) -> str | None:
    """The source text of `target` (`sampler`, `self.sampler`) if the loop `where` can read that
    variable at its top: same variable in the loop's scope, bound before the loop (not in it)."""
    if target is None or any(parent is where for parent, _ in syntax.ancestors(a, target)):
        return None
    ref, ref_there = a.ref(target), a.ref(target, a.scope_of.get(where))
    if ref is None or ref != ref_there:
        return None
    return ast.get_source_segment(a.text, target)


_HEAD = """import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
"""
_STEP = """        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
"""


def _epoch_loop_case(head: str, body: str, set_epoch: str) -> Invalid:
    """`head` ends with an epoch loop's header, where the finding is; its `body` never calls
    set_epoch, and the fix puts `set_epoch` first in it."""
    before = _HEAD + head
    return Invalid(before + body, line=before.count("\n"), fixed=f"{before}    {set_epoch}\n{body}")


SamplerWithoutSetEpoch.VALID = (
    # an unshuffled sampler has nothing to reseed
    _HEAD + "loader = DataLoader(data, sampler=DistributedSampler(data, shuffle=False))\n"
    "for epoch in range(3):\n    for x, y in loader:\n" + _STEP,
    # set_epoch inside the per-epoch function
    _HEAD + """loader = DataLoader(data, sampler=DistributedSampler(data))


def train_one_epoch(epoch):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
""" + _STEP + """

for epoch in range(3):
    train_one_epoch(epoch)
""",
)
SamplerWithoutSetEpoch.INVALID = (
    # rebuilt every epoch: still epoch 0 each time; no fix (the name is bound inside the loop)
    Invalid(
        _HEAD + "for epoch in range(3):\n    loader = DataLoader(data, sampler=DistributedSampler(data))\n"
        "    for x, y in loader:\n" + _STEP,
        line=9,
    ),
    _epoch_loop_case(
        "sampler = DistributedSampler(data)\nloader = DataLoader(data, sampler=sampler)\nfor epoch in range(3):\n",
        "    for x, y in loader:\n" + _STEP,
        set_epoch="sampler.set_epoch(epoch)",
    ),
    # a step budget: the `while` around the loader counts its passes in `epoch`
    _epoch_loop_case(
        "loader = DataLoader(data, sampler=DistributedSampler(data))\nstep = epoch = 0\nwhile step < 10:\n",
        "    for x, y in loader:\n" + _STEP + "        step += 1\n    epoch += 1\n",
        set_epoch="loader.sampler.set_epoch(epoch)",
    ),
    _epoch_loop_case(
        "train_loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=2)\nfor ep in range(3):\n",
        "    for x, y in train_loader:\n" + _STEP,
        set_epoch="train_loader.sampler.set_epoch(ep)",
    ),
    # a body on the loop's own line is spread out first
    Invalid(
        _HEAD + "sampler = DistributedSampler(data)\nloader = DataLoader(data, sampler=sampler)\n\n\ndef train():\n"
        "    for x, y in loader:\n" + _STEP + "\n\nfor epoch in range(3): train()\n",
        line=20,
        fixed=_HEAD + "sampler = DistributedSampler(data)\nloader = DataLoader(data, sampler=sampler)\n\n\ndef train():\n"
        "    for x, y in loader:\n" + _STEP + "\n\nfor epoch in range(3):\n    sampler.set_epoch(epoch)\n    train()\n",
    ),
)
