"""FSDP002: a whole-state gather of a sharded model that only some ranks run."""

from __future__ import annotations

from ddpify.anatomy.distributed.fsdp import is_legacy_fsdp
from ddpify.anatomy.distributed.names import STATE_DICT_GATHERS
from ddpify.anatomy.distributed.ranks import rank_guarded
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule


class StateDictGatherUnderRankGuard(Rule, code="FSDP002", name="state-dict-gather-under-rank-guard", severity="error"):
    """## What it does
    Flags `get_model_state_dict` / `get_optimizer_state_dict` / `get_state_dict`
    (`torch.distributed.checkpoint.state_dict`), and `state_dict()` of a legacy
    `FullyShardedDataParallel` model, where only some ranks run them: under `if rank == 0:`, after
    a rank-dependent `return`, or in a function only called from such places.

    ## Why is this bad?
    The parameters of a sharded model live in pieces on every rank; putting them back together is
    a collective that every rank must join. Run on rank 0 alone, it waits for the other ranks
    forever: the job hangs at its first checkpoint, with no error.

    ## Example
    ```python
    if rank == 0:
        torch.save(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)), "ckpt.pt")
    ```

    ## Use instead
    ```python
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(state, "ckpt.pt")
    ```

    ## Fix safety
    No fix: the gather must move out of the guard, which may need other statements to move too.
    """

    message = "gathering a sharded model's state is a collective: run it on every rank, then save on rank 0"

    def check(self, a):
        for call in a.calls:
            if _gathers_state(a, call) and rank_guarded(a, call.node):
                yield Finding(call.pos)


def _gathers_state(a, call) -> bool:
    if call.qualname in STATE_DICT_GATHERS:
        return True
    return syntax.method_name(call.node) == "state_dict" and is_legacy_fsdp(a, call.node.func.value)


_HEAD = """import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
fully_shard(model)
"""

StateDictGatherUnderRankGuard.VALID = (
    _HEAD + "state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))\n"
    "if dist.get_rank() == 0:\n    torch.save(state, 'ckpt.pt')\n",
)
StateDictGatherUnderRankGuard.INVALID = (
    Invalid(_HEAD + "if dist.get_rank() == 0:\n    torch.save(get_model_state_dict(model), 'ckpt.pt')\n", line=10),
    Invalid("""import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

dist.init_process_group("nccl")
model = FSDP(torch.nn.Linear(4, 1))
if dist.get_rank() == 0:
    torch.save(model.state_dict(), "ckpt.pt")
""", line=8),
)
