"""DDP013: a metric summed over one rank's shard and used as if it were the whole dataset's."""

from __future__ import annotations

import ast

from ddpify.anatomy import MODULE_SCOPE
from ddpify.anatomy.distributed.accelerate import is_prepared_loader
from ddpify.anatomy.distributed.every_rank_work import calls_collective
from ddpify.anatomy.distributed.samplers import loader_sampler
from ddpify.anatomy.distributed.reaching import callers
from ddpify.anatomy import syntax
from ddpify.anatomy.evaluation import statements_after
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import ACCELERATE_HEAD
from ddpify.rules._ddp import DDP_AND_ACCELERATE


class UnreducedMetric(Rule, code="DDP013", name="unreduced-metric", severity="warning"):
    """## What it does
    Flags a metric accumulated (`correct += ...`, `total_loss += ...`) in an evaluation loop over a
    loader with a `DistributedSampler`, and used after the loop, when neither that function nor
    any function calling it runs a collective (`all_reduce`, `all_gather`, `reduce`, ...) and the
    script does not use torchmetrics (which syncs its metrics itself). In a Hugging Face
    Accelerate script the shard is a loader handed to `accelerator.prepare`, and the collectives
    are the Accelerator's (`gather_for_metrics`, `gather`, `reduce`).

    ## Why is this bad?
    The sampler gives each rank 1/world-size of the evaluation set, so the sum covers one shard:
    each rank prints, logs or checkpoints-by a different, noisier number, and rank 0's "validation
    accuracy" is measured on a fraction of the data. Early stopping or best-model selection that
    reads it can differ between ranks, which then diverge or deadlock.

    ## Example
    ```python
    for x, y in val_loader:  # DistributedSampler inside
        correct += (model(x).argmax(1) == y).sum().item()
        total += y.numel()
    print(correct / total)
    ```

    ## Use instead
    ```python
    stats = torch.tensor([correct, total], device=device)
    dist.all_reduce(stats)
    print((stats[0] / stats[1]).item())
    ```

    ## Fix safety
    No fix: the reduction needs tensors on the right device and a decision of what to sum.
    """

    message = "metric accumulated over this rank's shard only (DistributedSampler); all_reduce it before using it"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        if a.names.imports("torchmetrics"):
            return
        for loop in a.step_loops:
            if loop.trains or loop.loader is None:
                continue
            shard = _sharded_by(a, loop.loader)
            if shard is None:
                continue
            scope = syntax.enclosing_function(a, loop.node)
            if _reduces(a, scope):
                continue
            accumulated = _first_used_accumulation(a, loop.node)
            if accumulated is not None:
                name = ast.get_source_segment(a.text, accumulated.target)
                yield Finding(a.pos(accumulated), f"`{name}` sums this rank's shard only ({shard}); all_reduce it before using it")


def _sharded_by(a, loader) -> str | None:
    """What gives each rank its own share of this loader's data: its sampler, or `accelerator.prepare`."""
    if is_prepared_loader(a, loader):
        return "a prepared loader: accelerator.gather_for_metrics or reduce"
    return "DistributedSampler" if loader_sampler(a, loader) is not None else None


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _reduces(a, scope: str, seen: frozenset[str] = frozenset()) -> bool:
    """Does the function (or a function calling it) run a collective?"""
    body = [s for s in a.tree.body if not isinstance(s, _DEFINITIONS)] if scope == MODULE_SCOPE else a.functions[scope].node.body
    if calls_collective(a, body):
        return True
    return any(
        (caller := syntax.enclosing_function(a, call)) not in seen and _reduces(a, caller, seen | {scope})
        for call in callers(a, scope)
    )


def _first_used_accumulation(a, loop: ast.For) -> ast.AugAssign | None:
    """The first `x += ...` in the loop whose variable is read after the loop."""
    after = statements_after(a, loop)
    for node in ast.walk(loop):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, (ast.Name, ast.Attribute)):
            target = ast.unparse(node.target)
            if any(ast.unparse(n) == target for stmt in after for n in ast.walk(stmt) if isinstance(n, (ast.Name, ast.Attribute))):
                return node
    return None


_HEAD = """import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 2)
data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
val_loader = DataLoader(data, sampler=DistributedSampler(data, shuffle=False))
"""
_EVAL = """

def evaluate():
    correct, total = 0, 0
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.numel()
"""

UnreducedMetric.VALID = (
    _HEAD + _EVAL + """    stats = torch.tensor([correct, total])
    dist.all_reduce(stats)
    return (stats[0] / stats[1]).item()
""",
    # the caller reduces
    _HEAD + _EVAL + """    return torch.tensor([correct, total])


stats = evaluate()
dist.all_reduce(stats)
""",
    # every rank evaluates the whole set: the metric is complete
    _HEAD + "full_loader = DataLoader(data, batch_size=4)\ncorrect = 0\nfor x, y in full_loader:\n"
    "    correct += (model(x).argmax(1) == y).sum().item()\nprint(correct / len(data))\n",
)
_SHARD_HEAD = _HEAD.replace(
    "val_loader = DataLoader(data, sampler=DistributedSampler(data, shuffle=False))\n",
    "\n\ndef shard(size):\n    return range(dist.get_rank(), size, dist.get_world_size())\n\n\nval_loader = DataLoader(data, sampler=shard(len(data)))\n",
)

# Accelerate: an evaluation loader handed to accelerator.prepare gives each process its share
_ACCELERATE = ACCELERATE_HEAD + """from torch.utils.data import DataLoader, TensorDataset
val_loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=2)
val_loader = accelerator.prepare(val_loader)
correct = 0
for x, y in val_loader:
"""
UnreducedMetric.VALID += (
    _ACCELERATE + "    preds, y = accelerator.gather_for_metrics((model(x).argmax(1), y))\n"
    "    correct += (preds == y).sum().item()\naccelerator.print(correct / 8)\n",
)

UnreducedMetric.INVALID = (
    Invalid(_ACCELERATE + "    correct += (model(x).argmax(1) == y).sum().item()\naccelerator.print(correct / 8)\n",
            line=_ACCELERATE.count("\n") + 1),
    Invalid(_HEAD + _EVAL + "    return correct / total\n", line=15),
    # a local function handing each rank its own indices shards the set too
    Invalid(_SHARD_HEAD + _EVAL + "    return correct / total\n", line=21),
)
