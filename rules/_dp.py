"""Helpers shared by the DataParallel rules: which values are the DataParallel wrapper, and which
forwards its replicas run.

The facts about `forward` and its outputs come from `ddpify.anatomy.forward` (the DP codemod reads
the same ones); this module turns them into what the rules report.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import DP_WRAPPER, Anatomy
from ddpify.anatomy.distributed.wrappers import is_wrapper
from ddpify.anatomy.forward import dp_wrapped_models, replica_forward_methods
from ddpify.rules._cases import NET

HEAD = "import torch\nfrom torch import nn\n\n\n" + NET + "\n\n"


def is_dp_wrapper(a: Anatomy, expr: ast.AST) -> bool:
    """Does `expr` evaluate to the DataParallel wrapper here (not the model inside it)?"""
    return is_wrapper(a, expr, DP_WRAPPER)


def dp_replica_forwards(a: Anatomy) -> list[ast.FunctionDef]:
    """Every `forward` (this file's classes) that the replicas of a DataParallel-wrapped model run."""
    return replica_forward_methods(a, dp_wrapped_models(a))

