"""Helpers shared by the DataParallel rules: the kind they apply to, which values are the
DataParallel wrapper, which forwards its replicas run, and the edits of their fixes.

The facts about `forward` and its outputs come from `ddpify.anatomy.forward` (the DP codemod reads
the same ones); this module turns them into what the rules report.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import DP_WRAPPER, ROLE_MODEL, Anatomy, ScriptKind
from ddpify.anatomy import distributed as ddp
from ddpify.anatomy.forward import dp_wrapped_models, replica_forward_methods
from ddpify.lint import Edit

DP_KINDS = frozenset({ScriptKind.DATA_PARALLEL})

# What `nn.DataParallel` answers itself besides what every nn.Module has (torch 2.x).
DP_ATTRIBUTES = frozenset({"module", "device_ids", "output_device", "dim", "src_device_obj", "device_type",
                           "replicate", "scatter", "parallel_apply", "gather"})
WRAPPER_ATTRIBUTES = ddp.MODULE_ATTRIBUTES | DP_ATTRIBUTES
_KEEPING_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "requires_grad_"})
_MAX_DEPTH = 12

HEAD = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


"""


def is_dp_wrapper(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """Does `expr` evaluate to the DataParallel wrapper here (not the model inside it)?"""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(expr, ast.Call):
        if a.qualname(expr.func) == DP_WRAPPER:
            return True
        if ddp.method_name(expr) in _KEEPING_METHODS:
            return is_dp_wrapper(a, expr.func.value, depth + 1)  # type: ignore[attr-defined]
        callee = a.callee(expr)
        return callee is not None and any(is_dp_wrapper(a, v, depth + 1) for v in ddp.returned_values(a, callee))
    if isinstance(expr, (ast.Name, ast.Attribute)) and a.has_role(expr, ROLE_MODEL):
        return any(is_dp_wrapper(a, v, depth + 1) for v in ddp.reaching_values(a, expr))
    return False


def dp_replica_forwards(a: Anatomy) -> list[ast.FunctionDef]:
    """Every `forward` (this file's classes) that the replicas of a DataParallel-wrapped model run."""
    return replica_forward_methods(a, dp_wrapped_models(a))


def insert_after(a: Anatomy, expr: ast.AST, text: str) -> Edit:
    """Insert `text` right after the expression (`.mean()`, `.module`)."""
    end = a.pos(expr)
    return Edit.insert(end.end_line, end.end_col, text)
