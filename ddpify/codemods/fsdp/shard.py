"""Shard each trained model with FSDP2's `fully_shard`: its repeated blocks first, then the root.

The shard goes where the DDP wrap would (right after the model reaches its device). Blocks are
the layers of the `nn.ModuleList`/`nn.Sequential` attributes that the anatomy found in the model
class; each becomes its own unit, so only one block's parameters are gathered at a time.

Where the script autocasts, `--mixed-precision policy` gives every `fully_shard` call an
`mp_policy`: parameters cast to autocast's dtype (bf16 unless the script asks for fp16) for forward
and backward, gradients reduced in fp32. The autocast regions and any GradScaler stay as written.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import CallSite, ModelSite
from ddpify.anatomy.distributed.names import MIXED_PRECISION_POLICY
from ddpify.anatomy.owned_optimizers import owned_optimizers
from ddpify.anatomy.syntax import keyword
from ddpify.anatomy.vocabulary import AUTOCAST, BFLOAT16, GRAD_SCALER, HALF_DTYPES
from ddpify.codemods.ddp.wrap import WrapModel


class ShardModel(WrapModel):
    """Shard each trained model with FSDP2's fully_shard (repeated blocks, then the root)."""

    NAME = "shard"
    CAST_AFTER_WRAP_BREAKS = False  # fully_shard's parameters follow a later cast (model.double() in the loop verifies exactly)
    WRAPS_SEEN_AHEAD = False  # its calls are no DDP rebinding: the plans reading the model wait for them

    def plan(self) -> None:
        autocasts = self.anatomy.calls_to(AUTOCAST)
        self._param_dtype = _policy_dtype(self.anatomy, autocasts) if self.options.mixed_precision == "policy" and autocasts else None
        super().plan()
        self._refuse_models_trained_past_forward()
        if self._param_dtype:
            self._report_policy(autocasts)
        else:
            self._advise_policy(autocasts)

    def _refuse_models_trained_past_forward(self) -> None:
        """The wrap leaves a model trained past its forward (`D1.compute_loss(x, gt)`) to be averaged by hand,
        which DDP's conversion does and FSDP's does not: never a model left unsharded and unaveraged."""
        for optimizer in owned_optimizers(self.anatomy):
            if optimizer.model is not None:
                self.missing(optimizer.built.line, f"{optimizer.why}: it is not sharded, and no gradient of it is averaged over the ranks",
                             "compute its loss in forward and call the model, or convert with --to ddp (which averages it by hand)")

    def add_wrapper_import(self) -> None:
        self.add_import("torch.distributed.fsdp", "fully_shard")
        if self._param_dtype:
            self.add_import(*MIXED_PRECISION_POLICY.rsplit(".", 1))

    def wrap_expression(self, name: str, find_unused: bool = False) -> str:
        return f"fully_shard({name}{self._policy_argument()})"  # it returns the module it shards

    def finds_unused(self, model: ModelSite) -> bool:
        return False  # FSDP2 reduces whatever gradients a backward made: it needs no search for unused parameters

    def wrapper_code(self, model: ModelSite, name: str) -> str:
        self._optimizer_before_shard(model, name)
        model_class = self.anatomy.model_classes.get(model.class_name)
        blocks = model_class.block_lists if model_class else []
        policy = self._policy_argument()
        code = [f"for shard_block in {name}.{attr}:\n    fully_shard(shard_block{policy})\n" for attr in blocks]
        return "".join(code) + f"fully_shard({name}{policy})\n"

    def wrapped_message(self, name: str) -> str:
        return f"sharded {name} with fully_shard (FSDP2)"

    # ----- mixed precision ---------------------------------------------------------------------
    def _policy_argument(self) -> str:
        if not self._param_dtype:
            return ""
        return f", mp_policy=MixedPrecisionPolicy(param_dtype={self._param_dtype}, reduce_dtype=torch.float32)"

    def _report_policy(self, autocasts: list[CallSite]) -> None:
        low = self._param_dtype.split(".")[1]  # type: ignore[union-attr]
        for autocast in autocasts:
            self.changed(autocast.line, f"fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype={self._param_dtype}, reduce_dtype=torch.float32)): "
                                        f"each unit's parameters are cast to {low} for forward and backward (the sharded fp32 copies stay "
                                        "the optimizer's), gradients are reduced in fp32; this autocast is kept and still casts op by op on top")
            dtype = keyword(autocast.node, "dtype")  # type: ignore[arg-type]
            if dtype is not None and self.anatomy.qualname(dtype.value) not in HALF_DTYPES | {BFLOAT16}:
                self.advise(autocast.line, f"autocast's dtype={ast.unparse(dtype.value)} is not a literal dtype: the policy uses "
                                           f"param_dtype={self._param_dtype}; change it if this run uses another dtype")
        for scaler in self.anatomy.calls_to(GRAD_SCALER):
            if self._param_dtype == BFLOAT16:
                self.advise(scaler.line, "GradScaler: bf16 parameters and gradients keep fp32's exponent range, so loss scaling is not needed; "
                                         "left in place (remove it by hand if you like)")
            else:
                self.advise(scaler.line, "GradScaler: keep it, fp16 gradients need loss scaling to avoid underflow")

    def _advise_policy(self, autocasts: list[CallSite]) -> None:
        for autocast in autocasts:
            self.advise(autocast.line, "autocast: FSDP2 can also keep bf16 copies of the parameters for compute and communication: "
                                       "fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)) "
                                       "saves memory and bandwidth but rounds parameters to bf16 in forward/backward; left as is "
                                       "(convert with --mixed-precision policy to write it)")
        for scaler in self.anatomy.calls_to(GRAD_SCALER):
            self.advise(scaler.line, "GradScaler works unchanged on FSDP2's fp32 parameters; drop it only if you switch to bf16 (no loss scaling needed)")
        if self.options.mixed_precision == "policy" and self.report.fulfilled and not autocasts:
            self.advise(self.report.changes[0].line if self.report.changes else 1,
                        "--mixed-precision policy: the script does not autocast, so its parameters stay fp32 (no mp_policy written)")

    def _optimizer_before_shard(self, model: ModelSite, name: str) -> None:
        """An optimizer built before the shard holds the unsharded parameters: it must come after."""
        anchor = model.ready_at
        for optimizer in self.anatomy.optimizers:
            if optimizer.scope == model.scope and optimizer.line < anchor.lineno:
                self.advise(optimizer.line, f"this optimizer is built before fully_shard({name}): build it after the shard, or it updates parameters FSDP no longer uses")


def _policy_dtype(anatomy, autocasts: list[CallSite]) -> str:
    """The parameters' dtype under the policy: fp16 only where every autocast that names its dtype names fp16."""
    named = {anatomy.qualname(kw.value) for c in autocasts if (kw := keyword(c.node, "dtype")) is not None}  # type: ignore[arg-type]
    return "torch.float16" if named and named <= HALF_DTYPES else BFLOAT16
