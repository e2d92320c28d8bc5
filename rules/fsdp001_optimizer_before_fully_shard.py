"""FSDP001: an optimizer built from a model's parameters before `fully_shard` shards it."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.fsdp import shard_calls
from ddpify.anatomy.distributed.wrappers import model_origins
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule


class OptimizerBeforeFullyShard(Rule, code="FSDP001", name="optimizer-before-fully-shard", severity="error"):
    """## What it does
    Flags a `torch.optim` optimizer constructed from a model's parameters earlier in the same
    function than the `fully_shard(model)` call (FSDP2) that shards that model.

    ## Why is this bad?
    `fully_shard` replaces each parameter with a sharded `DTensor`. An optimizer built before it
    holds the old, unsharded parameter objects: it steps tensors the forward pass no longer uses,
    so the model never learns, and nothing raises an error.

    ## Example
    ```python
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    fully_shard(model)
    ```

    ## Use instead
    ```python
    model = Net().to(device)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters())
    ```

    ## Fix safety
    No fix: moving the optimizer may move code that other statements depend on.
    """

    message = "optimizer built before fully_shard() shards its model: it steps parameters FSDP no longer uses"

    def check(self, a):
        for shard in shard_calls(a):
            module = syntax.argument(shard.node, 0, "module")  # type: ignore[arg-type]
            origins = model_origins(a, module) if module is not None else None
            if not origins:
                continue
            for optimizer in a.optimizers:
                if optimizer.scope == shard.scope and optimizer.line < shard.line and _reads_model(a, optimizer.node, origins):
                    yield Finding(optimizer.pos)


def _reads_model(a, call: ast.AST, origins: set[ast.Call]) -> bool:
    """Do the optimizer's arguments read the parameters of a model built by one of `origins`?"""
    return any(
        isinstance(node, (ast.Name, ast.Attribute)) and (model_origins(a, node) or set()) & origins
        for node in ast.walk(call)
    )


_HEAD = """import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
"""

OptimizerBeforeFullyShard.VALID = (
    _HEAD + "model = torch.nn.Linear(4, 1)\nfully_shard(model)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    _HEAD + "other = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(other.parameters(), lr=0.1)\nmodel = torch.nn.Linear(4, 1)\nfully_shard(model)\n",
)
OptimizerBeforeFullyShard.INVALID = (
    Invalid(_HEAD + "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfully_shard(model)\n", line=7),
    Invalid(_HEAD + "def main():\n    model = torch.nn.Linear(4, 1).to('cpu')\n    opt = torch.optim.Adam(model.parameters())\n"
            "    model = fully_shard(model)\n", line=8),
)
