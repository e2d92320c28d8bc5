"""Reading a sharded model's parameters: `model.weight` is this rank's shard (a DTensor) after
`fully_shard`; the whole value is `model.weight.full_tensor()`.

Gathering is a collective, so it is only written where every rank runs the read (an assignment,
an expression statement that no rank-0 duty will guard); a read inside a print, a log call or a
save is reported instead, to be hoisted by hand.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import ROLE_MODEL
from ddpify.anatomy.distributed import FULLY_SHARD, after_shard, rank_guarded
from ddpify.codemods.base import Transform, parse_expr

LAYER_PARAMETERS = frozenset({"weight", "bias"})  # what torch.nn layers name their parameters
RANK_ZERO_CALLS = ("print", "torch.save")


class FullParameters(Transform):
    """Reads of a sharded model's parameters gather the whole tensor (full_tensor)."""

    NAME = "parameters"
    SEES_EDITS_OF = ("setup", "shard")  # the fully_shard calls (and their rank guards)

    def plan(self) -> None:
        shards = self.anatomy.calls_to(*FULLY_SHARD)
        sharded = {o for s in shards if s.node.args for o in self.anatomy.origins(s.node.args[0], ROLE_MODEL)}  # type: ignore[attr-defined]
        if not sharded:
            return
        names = LAYER_PARAMETERS | {p for mc in self.anatomy.model_classes.values() for p in mc.parameters}
        for node in self.anatomy.nodes:
            if self._reads_parameter(node, names, sharded):
                self._gather(node)  # type: ignore[arg-type]

    def _reads_parameter(self, node: ast.AST, names: frozenset[str], sharded: set) -> bool:
        if not (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.ctx, ast.Load)):
            return False
        if self.anatomy.scope_of.get(node, "").split(".")[0] in self.anatomy.model_classes:
            return False  # the model's own forward reads its parameters unsharded
        parent = self.anatomy.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.attr == "full_tensor":
            return False
        return bool(self.anatomy.origins(_owner(node), ROLE_MODEL) & sharded) and after_shard(self.anatomy, node)

    def _gather(self, node: ast.Attribute) -> None:
        stmt = self.anatomy.stmt_of.get(node)
        if rank_guarded(self.anatomy, node) or any(c.stmt is stmt for c in self.anatomy.calls_to(*RANK_ZERO_CALLS)):
            self.advise(node.lineno, f"{ast.unparse(node)} is this rank's shard after fully_shard: assign "
                                     f"{ast.unparse(node)}.full_tensor() on every rank before rank 0 uses it")
            return
        self.rewrite_node(node, cst.Attribute, lambda attr: parse_expr(f"{cst.Module([]).code_for_node(attr)}.full_tensor()"))
        self.changed(node.lineno, f"{ast.unparse(node)} -> {ast.unparse(node)}.full_tensor() (the whole parameter, gathered on every rank)")


def _owner(attr: ast.Attribute) -> ast.expr:
    """The model in `model.fc.weight` / `model.weight`: the first name of the chain."""
    value = attr.value
    while isinstance(value, ast.Attribute) and not (isinstance(value.value, ast.Name) and value.value.id == "self"):
        value = value.value
    return value
