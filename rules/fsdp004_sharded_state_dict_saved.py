"""FSDP004: `torch.save(model.state_dict())` of a sharded model (FSDP2, or legacy FSDP in a sharded state-dict mode)."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.fsdp import in_sharded_legacy_mode, is_legacy_fsdp, is_sharded_model, shard_calls, sharded_legacy_state_dicts
from ddpify.anatomy import syntax
from ddpify.anatomy.vocabulary import TORCH_SAVE
from ddpify.lint import Finding, Invalid, Rule


class ShardedStateDictSaved(Rule, code="FSDP004", name="sharded-state-dict-saved", severity="error"):
    """## What it does
    Flags `torch.save(...)` of `model.state_dict()` (directly or inside a dict) where `model` was
    sharded with `fully_shard` (FSDP2), or is a legacy `FullyShardedDataParallel` whose state-dict
    mode is `SHARDED_STATE_DICT` or `LOCAL_STATE_DICT` (`with FSDP.state_dict_type(...)` or
    `FSDP.set_state_dict_type(...)`).

    ## Why is this bad?
    After `fully_shard`, `model.state_dict()` returns this rank's shards as `DTensor`s; legacy FSDP
    in a sharded mode returns this rank's shards too. Saved from rank 0, the file holds a fraction of
    every parameter; saved from every rank to one path, the ranks overwrite each other. Either way it
    does not load into the single-GPU model, and loading it elsewhere needs the same process group.

    ## Example
    ```python
    fully_shard(model)
    ...
    if rank == 0:
        torch.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    fully_shard(model)
    ...
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(state, "model.pt")
    ```
    (or `torch.distributed.checkpoint.save` on every rank for sharded checkpoints of very large
    models; with legacy FSDP, `StateDictType.FULL_STATE_DICT` with `FullStateDictConfig(rank0_only=True)`).

    ## Fix safety
    No fix: the gather is a collective and must run on every rank, outside any rank-0 guard.
    """

    message = "state_dict() of a fully_shard model holds this rank's shards only: gather it with get_model_state_dict(full_state_dict=True)"

    def check(self, a):
        if not shard_calls(a) and not sharded_legacy_state_dicts(a):
            return
        for save in a.calls_to(TORCH_SAVE):
            saved = syntax.argument(save.node, 0, "obj")  # type: ignore[arg-type]
            for node in ast.walk(saved) if saved is not None else ():
                if syntax.method_name(node) != "state_dict":
                    continue
                if is_sharded_model(a, node.func.value):
                    yield Finding(a.pos(node))
                elif is_legacy_fsdp(a, node.func.value) and in_sharded_legacy_mode(a, node):
                    yield Finding(a.pos(node), LEGACY_MESSAGE)


LEGACY_MESSAGE = ("in a SHARDED/LOCAL state-dict mode, legacy FSDP's state_dict() holds this rank's shards only: "
                  "save it with torch.distributed.checkpoint.save on every rank, or use FULL_STATE_DICT")

_HEAD = """import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
fully_shard(model)
"""

_LEGACY = """import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

dist.init_process_group("gloo")
model = FSDP(torch.nn.Linear(4, 1))
"""

ShardedStateDictSaved.VALID = (
    _HEAD + "state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))\ntorch.save(state, 'm.pt')\n",
    "import torch\nmodel = torch.nn.Linear(4, 1)\ntorch.save(model.state_dict(), 'm.pt')\n",
    _LEGACY + "with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):\n    state = model.state_dict()\n"
              "torch.save(state, 'm.pt')\n",
)

ShardedStateDictSaved.INVALID = (
    Invalid(_HEAD + "torch.save({'model': model.state_dict()}, 'm.pt')\n", line=9),
    Invalid(_LEGACY + "with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):\n"
                      "    torch.save(model.state_dict(), 'm.pt')\n", line=8),
    Invalid(_LEGACY + "FSDP.set_state_dict_type(model, StateDictType.LOCAL_STATE_DICT)\n"
                      "if dist.get_rank() == 0:\n    torch.save({'model': model.state_dict()}, 'm.pt')\n", line=9),
)
