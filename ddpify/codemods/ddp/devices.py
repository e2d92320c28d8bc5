"""Transform 2: every CUDA device the script names becomes this rank's own GPU.

`setup_distributed()` calls `torch.cuda.set_device(LOCAL_RANK)`, so "cuda" without an index,
`torch.device("cuda")` and `.cuda()` already mean this rank's GPU and are left alone. Only explicit
indices (`"cuda:0"`, `.cuda(0)`, `torch.device("cuda", 0)`, `.to(0)`, `set_device(0)`) are rewritten.
"""

from __future__ import annotations

import ast
import re

import libcst as cst

from ddpify.codemods.base import Transform, parse_expr
from ddpify.codemods.ddp.runtime import LOCAL_RANK

_INDEXED_CUDA = re.compile(r"^cuda:\d+$")


class RankDevices(Transform):
    NAME = "device"
    DESCRIPTION = "Explicit GPU indices become LOCAL_RANK; 'cuda' alone already means this rank's GPU."

    def plan(self) -> None:
        for node in ast.walk(self.anatomy.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _INDEXED_CUDA.match(node.value):
                self._rewrite_indexed_string(node)
            elif isinstance(node, ast.Call):
                self._rewrite_index_argument(node)
            elif isinstance(node, ast.Subscript) and self._is_visible_devices(node):
                self.advise(node.lineno, "CUDA_VISIBLE_DEVICES is set in the script; torchrun gives each rank its GPU via LOCAL_RANK, remove it")

    def _rewrite_indexed_string(self, node: ast.Constant) -> None:
        quote = '"'
        self.rewrite_node(node, cst.SimpleString, lambda _: parse_expr(f"f{quote}cuda:{{{LOCAL_RANK}}}{quote}"))
        self.changed(node.lineno, f"{node.value!r} -> this rank's GPU (f\"cuda:{{{LOCAL_RANK}}}\")")

    def _rewrite_index_argument(self, call: ast.Call) -> None:
        index = self._device_index_argument(call)
        if index is not None:
            self.rewrite_node(index, cst.Integer, lambda _: cst.Name(LOCAL_RANK))
            self.changed(call.lineno, f"GPU index {index.value} -> {LOCAL_RANK}")

    def _device_index_argument(self, call: ast.Call) -> ast.Constant | None:
        """The integer literal naming a GPU in `.cuda(0)`, `.to(0)`, `torch.device("cuda", 0)`, `set_device(0)`."""
        q = self.anatomy.qualname(call.func) or ""
        if q == "torch.device" and len(call.args) == 2:
            candidate = call.args[1]
        elif q == "torch.cuda.set_device" and call.args:
            candidate = call.args[0]
        elif isinstance(call.func, ast.Attribute) and call.func.attr in ("cuda", "to") and call.args and q != "torch.cuda":
            candidate = call.args[0]
        else:
            return None
        is_int = isinstance(candidate, ast.Constant) and type(candidate.value) is int
        return candidate if is_int else None  # type: ignore[return-value]

    def _is_visible_devices(self, node: ast.Subscript) -> bool:
        key = node.slice
        return (
            isinstance(node.ctx, ast.Store)
            and isinstance(key, ast.Constant)
            and key.value == "CUDA_VISIBLE_DEVICES"
        )
