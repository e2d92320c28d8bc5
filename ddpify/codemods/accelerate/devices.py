"""The script's device is the Accelerator's: `device = torch.device("cuda" if ... else "cpu")`
becomes `device = accelerator.device`, this process's GPU (or the CPU).

A device is a value the script picks for `.to(...)` (or `device=`): a `torch.device(...)` call, or
a device string ("cuda", "cpu", "cuda:0", a conditional of them) that it moves things to.
"""

from __future__ import annotations

import ast
import re

from ddpify.codemods.accelerate.runtime import DEVICE
from ddpify.codemods.base import Transform
from ddpify.edits.expressions import parse_expr

_DEVICE_NAME = re.compile(r"^(cuda|cpu|mps)(:\d+)?$")


class AcceleratorDevice(Transform):
    """The device the script picks becomes accelerator.device."""

    NAME = "device"
    SEES_EDITS_OF = ()

    def plan(self) -> None:
        targets = _moved_to(self.anatomy.nodes)
        for node in self.anatomy.nodes:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], (ast.Name, ast.Attribute))):
                continue
            if self._picks_device(node.value) and (self._builds_device(node.value) or ast.unparse(node.targets[0]) in targets):
                self.rewrite_expression(node.value, lambda _: parse_expr(DEVICE))
                self.changed(node.lineno, f"{ast.unparse(node.targets[0])} = {DEVICE}: this process's GPU (or the CPU)")

    def _builds_device(self, value: ast.expr) -> bool:
        return isinstance(value, ast.Call) and self.anatomy.qualname(value.func) == "torch.device"

    def _picks_device(self, value: ast.expr) -> bool:
        if isinstance(value, ast.IfExp):
            return self._picks_device(value.body) and self._picks_device(value.orelse)
        if isinstance(value, ast.Constant):
            return isinstance(value.value, str) and bool(_DEVICE_NAME.match(value.value))
        return self._builds_device(value)


def _moved_to(nodes) -> set[str]:
    """What the script moves things to: `x.to(device)`, `device=device`."""
    found = set()
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args:
            found.add(ast.unparse(node.args[0]))
        elif isinstance(node, ast.keyword) and node.arg == "device":
            found.add(ast.unparse(node.value))
    return found
