"""A DDP transform's edits written with the Accelerator: the code it inserts (its helpers included)
and the expressions it rewrites name `accelerator.process_index`, `accelerator.num_processes`,
`accelerator.device`, `accelerator.reduce` and accelerate.utils' broadcasts where the DDP target's
name RANK, WORLD_SIZE, RANK_DEVICE and torch.distributed (ddpify.codemods.accelerate.runtime).

Code that keeps a DDP name no spelling covers leaves the conversion incomplete, never a script
that names what it never defines.
"""

from __future__ import annotations

import ast
from typing import Callable, Sequence

import libcst as cst

from ddpify.anatomy.distributed.accelerate import ACCELERATE_UTILS
from ddpify.codemods.accelerate.runtime import accelerator_spelling, broadcasts_used, ddp_names_left
from ddpify.codemods.base import Transform
from ddpify.edits.expressions import parse_expr


class SpelledWithTheAccelerator(Transform):
    """Mixin (before the DDP transform it spells): its inserted code and rewritten expressions spelled with the Accelerator."""

    def _statements(self, code: str | Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        return super()._statements(self._spelled(code) if isinstance(code, str) else code)

    def rewrite_node(self, node: ast.AST, cst_type: type, rewrite: Callable[[cst.CSTNode], cst.CSTNode]) -> None:
        super().rewrite_node(node, cst_type, lambda old: self._spelled_node(rewrite(old)))

    def _spelled_node(self, node: cst.CSTNode) -> cst.CSTNode:
        """An expression a DDP edit made, spelled with the Accelerator (the node itself where it names no DDP name)."""
        if not isinstance(node, cst.BaseExpression):
            return node
        code = cst.Module([]).code_for_node(node)
        spelled = self._spelled(code)
        return node if spelled == code else parse_expr(spelled)

    def _spelled(self, code: str) -> str:
        """`code` spelled with the Accelerator, with the broadcasts it calls imported; a missing item where a DDP name is left."""
        spelled = accelerator_spelling(code)
        for name in broadcasts_used(spelled):
            self.add_import(ACCELERATE_UTILS, name)
        left = ddp_names_left(spelled)
        if left:
            self.missing(1, f"ddpify has no Accelerate spelling of {', '.join(left)}, which the {self.NAME} edit uses",
                         "write that edit by hand with accelerator.process_index, accelerator.num_processes and accelerator.reduce")
        return spelled
