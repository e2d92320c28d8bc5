"""FSDP004: `torch.save(model.state_dict())` of a model sharded with FSDP2."""

from __future__ import annotations

import ast

from ddpify.anatomy import distributed as dist_facts
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._ddp import DDP_KINDS


class ShardedStateDictSaved(Rule):
    """## What it does
    Flags `torch.save(...)` of `model.state_dict()` (directly or inside a dict) where `model` was
    sharded with `fully_shard` (FSDP2).

    ## Why is this bad?
    After `fully_shard`, `model.state_dict()` returns this rank's shards as `DTensor`s. Saved
    from rank 0, the file holds a fraction of every parameter; it does not load into the
    single-GPU model (shape mismatch), and loading it elsewhere needs the same process group.

    ## Example
    ```python
    if rank == 0:
        torch.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(state, "model.pt")
    ```
    (or `torch.distributed.checkpoint.save` for sharded checkpoints of very large models).

    ## Fix safety
    No fix: the gather is a collective and must run on every rank, outside any rank-0 guard.
    """

    code = "FSDP004"
    name = "sharded-state-dict-saved"
    message = "state_dict() of a fully_shard model holds this rank's shards only: gather it with get_model_state_dict(full_state_dict=True)"
    severity = "error"
    applies_to = DDP_KINDS

    def check(self, anatomy):
        a = anatomy
        if not dist_facts.shard_calls(a):
            return
        for save in a.calls_to("torch.save"):
            saved = syntax.argument(save.node, 0, "obj")  # type: ignore[arg-type]
            for node in ast.walk(saved) if saved is not None else ():
                if syntax.method_name(node) == "state_dict" and dist_facts.is_sharded_model(a, node.func.value):
                    yield Finding(a.pos(node))


_HEAD = """import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
fully_shard(model)
"""

ShardedStateDictSaved.VALID = (
    _HEAD + "state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))\ntorch.save(state, 'm.pt')\n",
    "import torch\nmodel = torch.nn.Linear(4, 1)\ntorch.save(model.state_dict(), 'm.pt')\n",
)
ShardedStateDictSaved.INVALID = (
    Invalid(_HEAD + "torch.save({'model': model.state_dict()}, 'm.pt')\n", line=9),
)
