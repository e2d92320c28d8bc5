"""Transform 4: `.module` for the DataParallel-wrapped model's own methods, attributes and state_dict().

DataParallel parallelises `forward` alone: a training step that calls another method of the model
(`loss = model.compute_loss(x, y)`) would run it through `.module`, on one GPU, and train exactly
as before. A method that only calls forward with its own arguments (`def predict(self, x): return
self(x)`) becomes a call of the wrapper; any other is left to the user: the conversion is incomplete.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import DP_WRAPPER
from ddpify.anatomy.scatter_gather import forward_aliases_of, training_method_call
from ddpify.codemods.module_access import ModuleAccess


class DPModuleAccess(ModuleAccess):
    """Methods, attributes and state_dict() of a DataParallel-wrapped model go through `.module`;
    a training step's call of a method other than forward goes through the wrapper, or is refused."""

    WRAPPER = DP_WRAPPER

    def _insert_module(self, node: ast.Attribute) -> None:
        if training_method_call(self.anatomy, node) is None:
            super()._insert_module(node)
        elif node.attr in forward_aliases_of(self.anatomy, node.value):
            self.rewrite_expression(node, lambda attr: attr.value)  # type: ignore[attr-defined]
            self.changed(node.lineno, f"{ast.unparse(node)}(...) -> {ast.unparse(node.value)}(...): {node.attr} only calls forward, "
                                      "which DataParallel runs on every GPU")
        else:
            super()._insert_module(node)
            self.missing(node.lineno, f"the training step calls {ast.unparse(node)}(...), not forward: DataParallel parallelises "
                                      "forward alone, so through .module it trains on one GPU",
                         f"compute it in forward and call the wrapper ({ast.unparse(node.value)}(...)), or use DistributedDataParallel")
