"""Transform 7: `.module` for the DDP-wrapped model's own methods, attributes and state_dict().

Where the name read is the wrapper on some paths and a plain model on others (the best model
reloaded with `model = torch.load(f)` after training, then evaluated by the function that evaluated
the wrapper; a function that rank-0-only code hands `model.module`, ddpify.codemods.ddp.rank_zero),
`.module` would fail on the plain one: the read goes through `plain_model(model)`, a
helper that unwraps only a wrapper.
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import Callable

import libcst as cst

from ddpify.anatomy import DDP_WRAPPER
from ddpify.anatomy.distributed.wrappers import wrapper_or_plain
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

    @cached_property
    def _plain_model_helper(self) -> bool:
        """Is `plain_model` there, or queued (once; False: no room for helpers)?"""
        return add_helpers(self, {PLAIN_CALL})


def _plain_model_of(wrapper: cst.CSTNode) -> cst.CSTNode:
    return cst.Call(func=cst.Name(PLAIN_CALL), args=[cst.Arg(wrapper)])  # type: ignore[arg-type]
