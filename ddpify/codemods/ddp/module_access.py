"""Transform 7: `.module` for the DDP-wrapped model's own methods, attributes and state_dict().

Where the name read is the wrapper on some paths and a plain model on others (the best model
reloaded with `model = torch.load(f)` after training, then evaluated by the function that evaluated
the wrapper; a function that rank-0-only code hands `model.module`, ddpify.codemods.ddp.rank_zero),
`.module` would fail on the plain one: the read goes through `plain_model(model)`, a
helper that unwraps only a wrapper.

A training step's call of a method that only calls forward (`def compute_loss(self, x, gt): return
self(x, gt)`) becomes a call of the wrapper: through `.module` it would run the model's forward past
the wrapper, whose gradients DDP then never averages. A method that runs the model otherwise is averaged
by hand, its model left unwrapped (ddpify.anatomy.owned_optimizers).
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import Callable

import libcst as cst

from ddpify.anatomy import DDP_WRAPPER
from ddpify.anatomy.distributed.wrappers import wrapper_or_plain
from ddpify.anatomy.scatter_gather import forward_aliases_of, training_method_call
from ddpify.codemods.ddp.evaluation import add_helpers
from ddpify.codemods.ddp.rank_zero import handed_plain
from ddpify.codemods.ddp.runtime import PLAIN_CALL
from ddpify.codemods.module_access import ModuleAccess


class DDPModuleAccess(ModuleAccess):
    """Methods, attributes and state_dict() of a DDP-wrapped model go through `.module`, or through
    `plain_model(...)` where the name may hold a plain model too."""

    WRAPPER = DDP_WRAPPER

    def reach_inner(self, read: ast.expr) -> tuple[Callable[[cst.CSTNode], cst.CSTNode], Callable[[str], str]]:
        if not (wrapper_or_plain(self.anatomy, read, self.WRAPPER) or handed_plain(self.anatomy, read)):
            return super().reach_inner(read)
        if self._plain_model_helper:
            return _plain_model_of, lambda name: f"{PLAIN_CALL}({name})"
        name = ast.unparse(read)
        self.missing(read.lineno, f"{name} holds the DDP wrapper or a plain model here: {name}.module fails on the plain one",
                     f"unwrap {name} only where it is a DistributedDataParallel")
        return super().reach_inner(read)

    def _insert_module(self, node: ast.Attribute) -> None:
        if training_method_call(self.anatomy, node) is not None and node.attr in forward_aliases_of(self.anatomy, node.value):
            self.rewrite_expression(node, lambda attr: attr.value)  # type: ignore[attr-defined]
            self.changed(node.lineno, f"{ast.unparse(node)}(...) -> {ast.unparse(node.value)}(...): {node.attr} only calls forward, "
                                      "which must run through the DDP wrapper for the ranks' gradients to be averaged")
        else:
            super()._insert_module(node)

    @cached_property
    def _plain_model_helper(self) -> bool:
        """Is `plain_model` there, or queued (once; False: no room for helpers)?"""
        return add_helpers(self, {PLAIN_CALL})


def _plain_model_of(wrapper: cst.CSTNode) -> cst.CSTNode:
    return cst.Call(func=cst.Name(PLAIN_CALL), args=[cst.Arg(wrapper)])  # type: ignore[arg-type]
