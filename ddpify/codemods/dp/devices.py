"""Transform 1: devices named inside `forward` follow the input's device instead.

DataParallel runs `forward` once per GPU, each replica on its own slice of the batch. A device
spelled out inside `forward` (`x.to("cuda:0")`, `.cuda()`, `torch.zeros(..., device=DEVICE)`)
sends every replica's tensors to that one GPU. `<input>.device` is right on every replica (and on
CPU). `x = x.to(DEVICE)` of forward's own input goes away: DataParallel already put it on the GPU.
"""

from __future__ import annotations

import ast


from ddpify.anatomy.forward import DeviceUse, function_of, hardcoded_devices, input_name, replica_forward_methods
from ddpify.codemods.base import Transform
from ddpify.codemods.dp._edits import remove_statement
from ddpify.edits.expressions import cuda_to, parse_expr


class ForwardDevices(Transform):
    """Devices hard-coded inside forward() become the input's device (each replica has its own GPU)."""

    NAME = "forward-device"

    def plan(self) -> None:
        for forward in replica_forward_methods(self.anatomy, self.anatomy.trained_models):
            for use in hardcoded_devices(self.anatomy, forward):
                self._follow_input(use, forward)

    def _follow_input(self, use: DeviceUse, forward: ast.FunctionDef) -> None:
        spelled = ast.unparse(use.node)
        source = input_name(forward)
        if source is None:
            where = function_of(self.anatomy, forward).scope  # type: ignore[union-attr]
            self.missing(use.node.lineno, f"{spelled} in {where} puts every replica on one device", "use the input tensor's .device")
            return
        device = f"{source}.device"
        if use.kind == "redundant":
            remove_statement(self, self.anatomy, use.stmt)
            self.changed(use.stmt.lineno, f"removed `{ast.unparse(use.stmt)}`: DataParallel already puts {source} on its replica's GPU")
        elif use.kind == "cuda":
            self.rewrite_expression(use.node, lambda call: cuda_to(call, device))  # type: ignore[arg-type]
            self.changed(use.node.lineno, f"{spelled} -> .to({device}) (the replica's GPU)")
        else:
            self.rewrite_expression(use.node, lambda _: parse_expr(device))  # type: ignore[arg-type]
            self.changed(use.node.lineno, f"{spelled} -> {device} (the replica's GPU)")
