"""FSDP003: `.module` on a model sharded with FSDP2's `fully_shard`."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.fsdp import is_sharded_model, shard_calls
from ddpify.anatomy.distributed.wrappers import is_wrapper, wrap_calls
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit, without_module


class ModuleOnFullyShardedModel(Rule, code="FSDP003", name="module-on-fully-sharded-model", severity="error"):
    """## What it does
    Flags `model.module` where `model` was sharded with `fully_shard` (FSDP2), typically left
    over from a DDP or legacy-FSDP version of the script.

    ## Why is this bad?
    `fully_shard` does not wrap the model: it changes the model's class in place, so the model
    keeps its own methods and attributes and has no `.module`. The access raises
    `AttributeError`, usually at the first checkpoint or evaluation, after training has run.

    ## Example
    ```python
    fully_shard(model)
    ...
    model.module.generate(prompt)
    ```

    ## Use instead
    ```python
    fully_shard(model)
    ...
    model.generate(prompt)
    ```

    ## Fix safety
    Safe: the fix drops `.module`, which is what the access meant.
    """

    message = "fully_shard keeps the model's class: it has no .module (AttributeError)"

    def check(self, a):
        if not shard_calls(a):
            return
        for node in a.nodes:
            if isinstance(node, ast.Attribute) and node.attr == "module" and is_sharded_model(a, node.value):
                if not wrap_calls(a) or not is_wrapper(a, node.value):
                    edit = expression_edit(a, node, without_module)
                    yield Finding(a.pos(node), fix=Fix((edit,), safe=True, description="drop .module") if edit else None)


_HEAD = """import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
fully_shard(model)
"""

ModuleOnFullyShardedModel.VALID = (
    _HEAD + "print(model.weight)\n",
    """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 1))
print(model.module.weight)
""",
)
ModuleOnFullyShardedModel.INVALID = (
    Invalid(_HEAD + "print(model.module.weight)\n", line=8, fixed=_HEAD + "print(model.weight)\n"),
    Invalid(_HEAD + "print((model).module.weight)\n", line=8, fixed=_HEAD + "print((model).weight)\n"),
)
