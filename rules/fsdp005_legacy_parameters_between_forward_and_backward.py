"""FSDP005: parameters of a legacy FSDP model read between its forward and `backward()`."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.fsdp import is_legacy_fsdp
from ddpify.anatomy.distributed.names import LEGACY_SUMMON
from ddpify.anatomy import syntax
from ddpify.anatomy.vocabulary import LEGACY_FSDP, PARAMETER_ATTRIBUTES, PARAMETER_METHODS
from ddpify.lint import Finding, Invalid, Rule


class LegacyParametersBetweenForwardAndBackward(
    Rule, code="FSDP005", name="legacy-fsdp-parameters-between-forward-and-backward", severity="error"
):
    """## What it does
    Flags reads of a legacy `FullyShardedDataParallel` model's parameters (`model.parameters()`,
    `model.named_parameters()`, `model.fc.weight`) after its forward and before `backward()` in a
    training step, outside `FSDP.summon_full_params(model)`.

    ## Why is this bad?
    Legacy FSDP flattens each wrapped module's parameters into one sharded `FlatParameter` and
    frees the gathered copy after forward. Between forward and backward, `model.parameters()`
    yields this rank's 1-D shards and `model.fc.weight` is an empty view, so a term built from them
    (a hand-written weight penalty, a norm in the loss) is not the model's and differs per rank:
    training silently goes wrong, or fails on a shape. FSDP2's `fully_shard` keeps parameters as
    `DTensor`s, which compute such terms correctly.

    ## Example
    ```python
    model = FSDP(Net())
    loss = criterion(model(x), y) + 1e-4 * sum(p.pow(2).sum() for p in model.parameters())
    loss.backward()
    ```

    ## Use instead
    ```python
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    loss = criterion(model(x), y) + 1e-4 * sum(p.pow(2).sum() for p in model.parameters())
    loss.backward()
    ```
    (or compute the term inside `forward`, or pass `weight_decay` to the optimizer).

    ## Fix safety
    No fix: where the term belongs depends on the model.
    """

    message = "legacy FSDP reshards after forward: these are this rank's flat shards, not the model's parameters"

    def check(self, a):
        if not a.calls_to(LEGACY_FSDP):
            return
        for loop in a.step_loops:
            span = a.forward_to_backward(loop.node.body) if loop.trains else None  # type: ignore[attr-defined]
            if span is None:
                continue
            first, last, forward = span
            end = (forward.end_lineno, forward.end_col_offset)
            for stmt in loop.node.body[first:last + 1]:  # type: ignore[attr-defined]
                for node in ast.walk(stmt):
                    if _after(node, end) and _reads_legacy_parameters(a, node) and not _summoned(a, node):
                        yield Finding(a.pos(node))


def _after(node: ast.AST, end: tuple) -> bool:
    return hasattr(node, "lineno") and (node.lineno, node.col_offset) >= end  # type: ignore[attr-defined]


def _reads_legacy_parameters(a, node: ast.AST) -> bool:
    """`m.parameters()` / `m.named_parameters()` on the wrapper, or `m.<...>.weight` below it."""
    if isinstance(node, ast.Call) and syntax.method_name(node) in PARAMETER_METHODS:
        return is_legacy_fsdp(a, node.func.value)  # type: ignore[attr-defined]
    if isinstance(node, ast.Attribute) and node.attr in PARAMETER_ATTRIBUTES:
        root = node.value
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        return is_legacy_fsdp(a, root)
    return False


def _summoned(a, node: ast.AST) -> bool:
    """Is `node` inside `with FSDP.summon_full_params(...)`?"""
    return any(
        isinstance(item.context_expr, ast.Call) and a.qualname(item.context_expr.func) == LEGACY_SUMMON
        for block in a.enclosing(node, (ast.With, ast.AsyncWith)) for item in block.items  # type: ignore[attr-defined]
    )


_HEAD = """import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
model = FSDP(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2):
    optimizer.zero_grad()
"""

LegacyParametersBetweenForwardAndBackward.VALID = (
    _HEAD + "    loss = nn.functional.mse_loss(model(x), y)\n    loss.backward()\n    optimizer.step()\n",
    _HEAD + "    out = model(x)\n    with FSDP.summon_full_params(model):\n"
            "        penalty = sum(p.pow(2).sum() for p in model.parameters())\n"
            "    (nn.functional.mse_loss(out, y) + penalty).backward()\n    optimizer.step()\n",
    _HEAD.replace("FSDP(nn.Sequential", "(nn.Sequential")
    + "    loss = nn.functional.mse_loss(model(x), y) + sum(p.pow(2).sum() for p in model.parameters())\n"
      "    loss.backward()\n    optimizer.step()\n",
)
LegacyParametersBetweenForwardAndBackward.INVALID = (
    Invalid(_HEAD + "    loss = nn.functional.mse_loss(model(x), y) + 1e-4 * sum(p.pow(2).sum() for p in model.parameters())\n"
                    "    loss.backward()\n    optimizer.step()\n", line=12),
    Invalid(_HEAD + "    out = model(x)\n    loss = nn.functional.mse_loss(out, y) + model.module[0].weight.norm()\n"
                    "    loss.backward()\n    optimizer.step()\n", line=13),
)
