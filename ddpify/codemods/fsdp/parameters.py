"""Reading a sharded model's parameters: `model.weight` is this rank's shard (a DTensor) after
`fully_shard`; the whole value is `model.weight.full_tensor()`.

Gathering is a collective, so it is only written where every rank runs the read (an assignment,
an expression statement that no rank-0 duty will guard); a read inside rank-0 output (a print, a
log record, a save: ddpify.anatomy.output) is reported instead, to be hoisted by hand.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import ROLE_MODEL, Anatomy
from ddpify.anatomy.distributed.fsdp import after_shard
from ddpify.anatomy.distributed.names import FULLY_SHARD
from ddpify.anatomy.distributed.ranks import rank_guarded
from ddpify.anatomy.output import output_kind
from ddpify.anatomy.vocabulary import PARAMETER_METHODS
from ddpify.codemods.base import Transform
from ddpify.codemods.options import Options
from ddpify.edits.expressions import parse_expr

LAYER_PARAMETERS = frozenset({"weight", "bias"})  # what torch.nn layers name their parameters
VALUE_READS = frozenset({"tolist", "cpu", "numpy", "item", "flatten", "view", "reshape"})


class FullParameters(Transform):
    """Reads of a sharded model's parameters gather the whole tensor (full_tensor)."""

    NAME = "parameters"
    SEES_EDITS_OF = ("setup", "shard")  # the fully_shard calls (and their rank guards)

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        """Judged before the shard too (it adds no such read): does the code read a parameter of a
        model, or loop over a model's parameters?"""
        names = _parameter_names(anatomy)
        return any(_iterates_parameters(node) or ((owner := _parameter_owner(anatomy, node, names)) is not None
                                                  and anatomy.origins(owner, ROLE_MODEL)) for node in anatomy.nodes)

    def plan(self) -> None:
        shards = self.anatomy.calls_to(*FULLY_SHARD)
        sharded = {o for s in shards if s.node.args for o in self.anatomy.origins(s.node.args[0], ROLE_MODEL)}  # type: ignore[attr-defined]
        if not sharded:
            return
        names = _parameter_names(self.anatomy)
        for node in self.anatomy.nodes:
            if self._reads_parameter(node, names, sharded):
                self._gather(node)  # type: ignore[arg-type]
            elif self._reads_shard_values(node, sharded):
                parameter = ast.unparse(node.target.elts[-1] if isinstance(node.target, ast.Tuple) else node.target)  # type: ignore[attr-defined]
                self.missing(node.iter.lineno, f"`{ast.unparse(node.iter)}` yields this rank's shards (DTensors) after fully_shard, "  # type: ignore[attr-defined]
                                               "and their values are read here",
                             f"read {parameter}.full_tensor() instead, computed on every rank (a collective) before rank 0 uses it")

    def _reads_shard_values(self, node: ast.AST, sharded: set) -> bool:
        """`for name, p in model.named_parameters(): ... p.tolist() ...` (or `.cpu()`, `.numpy()`, `.item()`, `.flatten()`)
        over a sharded model: the values of a DTensor shard can't be read as a whole tensor's."""
        if not _iterates_parameters(node):
            return False
        if not (self.anatomy.origins(node.iter.func.value, ROLE_MODEL) & sharded and after_shard(self.anatomy, node.iter)):
            return False
        names = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        body = node.body if isinstance(node, ast.For) else [self.anatomy.parents.get(node)]
        return any(isinstance(n, ast.Attribute) and n.attr in VALUE_READS and _reads_variable(n.value, names)
                   for stmt in body for n in ast.walk(stmt))

    def _reads_parameter(self, node: ast.AST, names: frozenset[str], sharded: set) -> bool:
        owner = _parameter_owner(self.anatomy, node, names)
        return owner is not None and bool(self.anatomy.origins(owner, ROLE_MODEL) & sharded) and after_shard(self.anatomy, node)

    def _gather(self, node: ast.Attribute) -> None:
        stmt = self.anatomy.stmt_of.get(node)
        if rank_guarded(self.anatomy, node) or any(c.stmt is stmt and output_kind(self.anatomy, c.node) for c in self.anatomy.calls):
            self.advise(node.lineno, f"{ast.unparse(node)} is this rank's shard after fully_shard: assign "
                                     f"{ast.unparse(node)}.full_tensor() on every rank before rank 0 uses it")
            return
        self.rewrite_node(node, cst.Attribute, lambda attr: parse_expr(f"{cst.Module([]).code_for_node(attr)}.full_tensor()"))
        self.changed(node.lineno, f"{ast.unparse(node)} -> {ast.unparse(node)}.full_tensor() (the whole parameter, gathered on every rank)")


def _parameter_names(anatomy: Anatomy) -> frozenset[str]:
    return LAYER_PARAMETERS | {p for mc in anatomy.model_classes.values() for p in mc.parameters}


def _parameter_owner(anatomy: Anatomy, node: ast.AST, names: frozenset[str]) -> ast.expr | None:
    """The model in `model.fc.weight` where `node` reads a parameter of what it holds outside its
    own class (its forward reads them unsharded), and not already as `.full_tensor()`."""
    if not (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.ctx, ast.Load)):
        return None
    if anatomy.scope_of.get(node, "").split(".")[0] in anatomy.model_classes:
        return None
    parent = anatomy.parents.get(node)
    return None if isinstance(parent, ast.Attribute) and parent.attr == "full_tensor" else _owner(node)


def _iterates_parameters(node: ast.AST) -> bool:
    """`for name, p in model.named_parameters():` (or a comprehension's)."""
    return (isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, ast.Call)
            and isinstance(node.iter.func, ast.Attribute) and node.iter.func.attr in PARAMETER_METHODS)


def _reads_variable(expr: ast.AST, names: set[str]) -> bool:
    """Is `expr` one of `names`, or a chain of calls on it (`p.detach().cpu()`)?"""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        expr = expr.func.value
    return isinstance(expr, ast.Name) and expr.id in names


def _owner(attr: ast.Attribute) -> ast.expr:
    """The model in `model.fc.weight` / `model.weight`: the first name of the chain."""
    value = attr.value
    while isinstance(value, ast.Attribute) and not (isinstance(value.value, ast.Name) and value.value.id == "self"):
        value = value.value
    return value
