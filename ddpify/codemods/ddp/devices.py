"""Transform 2: every CUDA device the script names becomes this rank's own GPU.

`setup_distributed()` calls `torch.cuda.set_device(LOCAL_RANK)`, so "cuda" without an index,
`torch.device("cuda")` and `.cuda()` already mean this rank's GPU and are left alone. Only explicit
indices are rewritten: literals (`"cuda:0"`, `.cuda(0)`, `torch.device("cuda", 0)`, `.to(0)`,
`set_device(0)`) and indices held in variables (`.cuda(gpu)`, `set_device(args.gpu)`,
`f"cuda:{args.gpu}"`, `.to(self.gpu_id)` where `self.gpu_id` holds an int).
"""

from __future__ import annotations

import ast
import re

import libcst as cst

from ddpify.anatomy.distributed.launch import holds_integer
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import LOCAL_RANK
from ddpify.codemods.dp._edits import remove_statement
from ddpify.edits.expressions import parse_expr

_INDEXED_CUDA = re.compile(r"^cuda:\d+$")


class RankDevices(Transform):
    """Explicit GPU indices become LOCAL_RANK; 'cuda' alone already means this rank's GPU."""

    NAME = "device"
    SEES_EDITS_OF = ()

    def plan(self) -> None:
        for node in self.anatomy.nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _INDEXED_CUDA.match(node.value):
                self._rewrite_indexed_string(node)
            elif isinstance(node, ast.Call):
                self._rewrite_index_argument(node)
            elif isinstance(node, ast.JoinedStr):
                self._rewrite_formatted_index(node)
            elif isinstance(node, ast.Subscript) and self._is_visible_devices(node):
                self._remove_visible_devices(node)

    def _rewrite_indexed_string(self, node: ast.Constant) -> None:
        quote = '"'
        self.rewrite_node(node, cst.SimpleString, lambda _: parse_expr(f"f{quote}cuda:{{{LOCAL_RANK}}}{quote}"))
        self.changed(node.lineno, f"{node.value!r} -> this rank's GPU (f\"cuda:{{{LOCAL_RANK}}}\")")

    def _rewrite_index_argument(self, call: ast.Call) -> None:
        index = self._device_index_argument(call)
        if isinstance(index, ast.Constant):
            self.rewrite_node(index, cst.Integer, lambda _: cst.Name(LOCAL_RANK))
            self.changed(call.lineno, f"GPU index {index.value} -> {LOCAL_RANK}")
        elif index is not None:
            self._rewrite_index_variable(index)

    def _rewrite_formatted_index(self, text: ast.JoinedStr) -> None:
        """`f"cuda:{gpu}"`: the index after a literal `cuda:` becomes LOCAL_RANK."""
        for before, part in zip(text.values, text.values[1:]):
            if isinstance(before, ast.Constant) and str(before.value).endswith("cuda:") and isinstance(part, ast.FormattedValue):
                self._rewrite_index_variable(part.value)

    def _rewrite_index_variable(self, index: ast.AST) -> None:
        if not isinstance(index, (ast.Name, ast.Attribute, ast.Subscript)) or (isinstance(index, ast.Name) and index.id == LOCAL_RANK):
            return
        self.rewrite_expression(index, lambda _: cst.Name(LOCAL_RANK))
        self.changed(index.lineno, f"GPU index {ast.unparse(index)} -> {LOCAL_RANK}")

    def _device_index_argument(self, call: ast.Call) -> ast.expr | None:
        """The expression naming a GPU in `.cuda(i)`, `torch.device("cuda", i)`, `set_device(i)`, and
        `.to(i)` where `i` holds an int (`.to(device)` with a device object is left alone)."""
        q = self.anatomy.qualname(call.func) or ""
        if q == "torch.device" and len(call.args) == 2:
            return call.args[1]
        if q == "torch.cuda.set_device" and call.args:
            return call.args[0]
        if isinstance(call.func, ast.Attribute) and call.args and q != "torch.cuda":
            if call.func.attr == "cuda" or (call.func.attr == "to" and holds_integer(self.anatomy, call.args[0])):
                return call.args[0]
        return None

    def _remove_visible_devices(self, node: ast.Subscript) -> None:
        """`os.environ["CUDA_VISIBLE_DEVICES"] = ...` alone on its statement, with one after it in its
        block, is removed with a comment: each rank's GPU is LOCAL_RANK, and a list pinned here would
        have every rank number the same GPU 0 (ddpify lint's DDP014). Otherwise the transform advises."""
        stmt = self.anatomy.parents.get(node)
        block = self.anatomy.block_of(stmt) if isinstance(stmt, ast.Assign) and stmt.targets == [node] else []
        if not block or block[-1] is stmt:
            self.advise(node.lineno, "CUDA_VISIBLE_DEVICES is set in the script; torchrun gives each rank its GPU via LOCAL_RANK, remove it")
            return
        code = ast.get_source_segment(self.anatomy.text, stmt)
        remove_statement(self, self.anatomy, stmt, f"# ddpify: removed `{code}`: each rank uses GPU LOCAL_RANK; choose the GPUs in the launching shell")
        self.changed(node.lineno, f"{code} removed: torchrun gives each rank its GPU (LOCAL_RANK); set CUDA_VISIBLE_DEVICES in the shell that launches it")

    def _is_visible_devices(self, node: ast.Subscript) -> bool:
        key = node.slice
        return (
            isinstance(node.ctx, ast.Store)
            and isinstance(key, ast.Constant)
            and key.value == "CUDA_VISIBLE_DEVICES"
        )
