"""Shard each trained model with FSDP2's `fully_shard`: its repeated blocks first, then the root.

The shard goes where the DDP wrap would (right after the model reaches its device). Blocks are
the layers of the `nn.ModuleList`/`nn.Sequential` attributes that the anatomy found in the model
class; each becomes its own unit, so only one block's parameters are gathered at a time.
"""

from __future__ import annotations

from ddpify.anatomy import ModelSite
from ddpify.codemods.ddp.wrap import WrapModel


class ShardModel(WrapModel):
    NAME = "shard"
    DESCRIPTION = "Shard each trained model with FSDP2's fully_shard (repeated blocks, then the root)."

    def plan(self) -> None:
        super().plan()
        for autocast in self.anatomy.calls_to("torch.autocast"):
            self.advise(autocast.line, "autocast: FSDP2 can also keep bf16 copies of the parameters for compute and communication: "
                                       "fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)) "
                                       "saves memory and bandwidth but rounds parameters to bf16 in forward/backward; left as is")
        for scaler in self.anatomy.calls_to("torch.amp.GradScaler"):
            self.advise(scaler.line, "GradScaler works unchanged on FSDP2's fp32 parameters; drop it only if you switch to bf16 (no loss scaling needed)")

    def add_wrapper_import(self) -> None:
        self.add_import("torch.distributed.fsdp", "fully_shard")

    def wrap_expression(self, name: str) -> str:
        return f"fully_shard({name})"  # it returns the module it shards

    def wrapper_code(self, model: ModelSite, name: str) -> str:
        self._optimizer_before_shard(model, name)
        model_class = self.anatomy.model_classes.get(model.class_name)
        blocks = model_class.block_lists if model_class else []
        code = [f"for shard_block in {name}.{attr}:\n    fully_shard(shard_block)\n" for attr in blocks]
        return "".join(code) + f"fully_shard({name})\n"

    def wrapped_message(self, name: str) -> str:
        return f"sharded {name} with fully_shard (FSDP2)"

    def _optimizer_before_shard(self, model: ModelSite, name: str) -> None:
        """An optimizer built before the shard holds the unsharded parameters: it must come after."""
        anchor = model.placements[-1] if model.placements else model.stmt
        for optimizer in self.anatomy.optimizers:
            if optimizer.scope == model.scope and optimizer.line < anchor.lineno:
                self.advise(optimizer.line, f"this optimizer is built before fully_shard({name}): build it after the shard, or it updates parameters FSDP no longer uses")
