"""The sharded model as one object: `copy.deepcopy(model)`, `torch.save(model, path)` and tracing after `fully_shard`.

FSDP2 replaces the parameters by DTensors that hold this rank's shard and hooks the module's forward:
a deep copy is refused ("FSDP does not support deepcopy"), pickling the module fails and so does tracing
it (`torch.jit.trace`, `writer.add_graph`: an internal assert on the DTensor parameters). There is no
safe rewrite that keeps the script's meaning (a copy of the whole model, a file that loads as a
module, a traced graph), so the conversion names it as missing: copy, save or trace the full state dict instead.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.fsdp import after_shard, is_sharded_model
from ddpify.anatomy.vocabulary import TORCH_SAVE
from ddpify.codemods.base import Transform
from ddpify.codemods.options import Options
from ddpify.codemods.module_access import calls_handed_the_model

_TODO = {
    "copy.deepcopy": "copy the model before fully_shard, or build a fresh one and load "
                     "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)) into it",
    TORCH_SAVE: "save get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)) "
                  "on rank 0 and load it into a fresh model",
}
_TRACE_TODO = ("trace a fresh model built the same way, before fully_shard, with "
               "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)) loaded into it")


class WholeShardedModel(Transform):
    """Say what a deep copy, a pickle or a trace of the sharded model needs by hand (each fails after fully_shard)."""

    NAME = "shard"
    SEES_EDITS_OF = ("shard",)  # where fully_shard now runs

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        """Only a call handed a model can be handed the sharded one (the shard adds none)."""
        return bool(calls_handed_the_model(anatomy))

    def plan(self) -> None:
        for call in calls_handed_the_model(self.anatomy):
            whole = call.node.args[0] if call.node.args else None  # type: ignore[attr-defined]
            if whole is not None and is_sharded_model(self.anatomy, whole) and after_shard(self.anatomy, call.node):
                self.missing(call.line, f"{call.qualname}({ast.unparse(whole)}) fails once the model is sharded by fully_shard",
                             _TODO.get(call.qualname, _TRACE_TODO))
