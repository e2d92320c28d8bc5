"""A prepared model's own methods, attributes and state_dict() through `accelerator.unwrap_model`.

prepare hands back a wrapper (DistributedDataParallel on several processes) that lacks the model's
own methods and attributes, and whose state_dict() keys gain a `module.` prefix. Every read that
would need `.module` under DDP goes through `accelerator.unwrap_model(model)`, which is the model
itself wherever it is not wrapped (before prepare, or on one process).
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import DDP_WRAPPER
from ddpify.anatomy.distributed.wrappers import may_become_wrapper
from ddpify.codemods.accelerate.runtime import UNWRAP_MODEL
from ddpify.codemods.module_access import ModuleAccess
from ddpify.edits.expressions import parse_expr


class UnwrapModelAccess(ModuleAccess):
    """Methods, attributes and state_dict() of a prepared model go through accelerator.unwrap_model."""

    NAME = "unwrap"
    SEES_EDITS_OF = ()
    WRAPPER = DDP_WRAPPER  # what prepare wraps a model in on several processes

    def wraps_here(self) -> bool:
        return bool(self.anatomy.trained_models)

    def _on_wrapper(self, expr: ast.AST) -> bool:
        """A model anywhere: unwrap_model of a model that is not wrapped is the model itself."""
        return may_become_wrapper(self.anatomy, expr, self.WRAPPER)

    def inner(self, wrapper: cst.CSTNode) -> cst.CSTNode:
        return cst.Call(func=parse_expr(UNWRAP_MODEL), args=[cst.Arg(wrapper)])  # type: ignore[arg-type]

    def inner_code(self, name: str) -> str:
        return f"{UNWRAP_MODEL}({name})"
