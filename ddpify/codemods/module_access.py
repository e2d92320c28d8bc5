"""Shared by DDP and DP: reach the user's model through `.module` once it is wrapped.

A wrapper (DDP or DataParallel) forwards calls and `parameters()`, but not the model's own methods
and attributes (`model.generate()`, `model.vocab`), and its `state_dict()` keys gain a `module.`
prefix. After the wrap those go through `.module`, so they work and checkpoints load into the
single-GPU script unchanged; so do indexing (`net[0]`: a wrapper has no items) and the calls that
mean the model itself (`torch.save(model)`, `copy.deepcopy(model)`) or trace it (`writer.add_graph(model, x)`,
`torch.jit.trace(model, x)`: the wrapper's forward cannot be traced).
"""

from __future__ import annotations

import ast
from typing import Callable, Iterator

import libcst as cst

from ddpify.anatomy import ROLE_MODEL, ROLE_WRITER, Anatomy
from ddpify.anatomy.distributed.wrappers import is_wrapper, may_become_wrapper
from ddpify.anatomy.vocabulary import INNER_MODEL_CALLS, TRACES, TRACING_WRITER_METHODS, reads_through_module
from ddpify.codemods.base import PlannedOnTheWrapsMade
from ddpify.codemods.options import Options
from ddpify.edits.expressions import module_of


class ModuleAccess(PlannedOnTheWrapsMade):
    """Custom methods/attributes and state_dict() of a wrapped model go through `.module`; subclasses
    name the wrapper's qualified name. It reads the wrapper the wrap makes."""

    NAME = "module"
    WRAPPER = ""

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        """Judged before the wrap too: is a model read where its wrapper would need `.module`?"""
        if anatomy.wrapped_elsewhere:
            return True
        return any(_reads_through_module(anatomy, lambda expr: may_become_wrapper(anatomy, expr, cls.WRAPPER)))

    def plan(self) -> None:
        if not self.wraps_here() and not self.anatomy.wrapped_elsewhere:
            return
        for node, whole in _reads_through_module(self.anatomy, self._on_wrapper):
            if whole is not None:
                inner, inner_code = self.reach_inner(whole)
                self.rewrite_expression(whole, inner)
                name = ast.unparse(whole)
                does = INNER_MODEL_CALLS.get(node.qualname, TRACES)  # a writer's add_graph traces
                self.changed(node.line, f"{node.qualname}({name}) -> {does.format(inner_code(name))}")
            elif isinstance(node, ast.Subscript):
                self._index_module(node)
            else:
                self._insert_module(node)

    def _on_wrapper(self, expr: ast.AST) -> bool:
        """Does `expr` hold the wrapper where it is read (judged as the lint rules judge it), or a
        model another file of the project hands in already wrapped?"""
        if self.anatomy.origins(expr, ROLE_MODEL) & self.anatomy.wrapped_elsewhere:  # type: ignore[operator]
            return True
        return is_wrapper(self.anatomy, expr, self.WRAPPER)

    def wraps_here(self) -> bool:
        """Does this file wrap a model in the wrapper?"""
        return bool(self.anatomy.calls_to(self.WRAPPER))

    def reach_inner(self, read: ast.expr) -> tuple[Callable[[cst.CSTNode], cst.CSTNode], Callable[[str], str]]:
        """How the model inside the wrapper that `read` holds is reached: the rewrite of `read` and its
        code in the report (`inner`, `inner_code`); a subclass may choose by the read."""
        return self.inner, self.inner_code

    def inner(self, wrapper: cst.CSTNode) -> cst.CSTNode:
        """The model inside `wrapper`."""
        return module_of(wrapper)

    def inner_code(self, name: str) -> str:
        """How the model inside the wrapper `name` is spelled (in the report)."""
        return f"{name}.module"

    def _index_module(self, node: ast.Subscript) -> None:
        """`net[0]`: a wrapper has no items (`nn.Sequential`, `nn.ModuleList`), its module has."""
        inner, inner_code = self.reach_inner(node.value)
        self.rewrite_expression(node.value, inner)
        name = ast.unparse(node.value)
        self.changed(node.lineno, f"{name}[...] -> {inner_code(name)}[...]")

    def _insert_module(self, node: ast.Attribute) -> None:
        inner, inner_code = self.reach_inner(node.value)
        target = ast.unparse(node.value)
        self.rewrite_node(node, cst.Attribute, lambda attr: attr.with_changes(value=inner(attr.value)))  # type: ignore[attr-defined]
        self.changed(node.lineno, f"{target}.{node.attr} -> {inner_code(target)}.{node.attr}")


def _reads_through_module(a: Anatomy, on_wrapper: Callable[[ast.AST], bool]) -> Iterator[tuple]:
    """Each read that goes through `.module` where `on_wrapper` holds: (attribute, None) for a method or
    attribute the wrapper lacks, (subscript, None) for an index, (call site, model) for a call handed the model itself."""
    for node in a.nodes_of(ast.Attribute, ast.Subscript):
        if isinstance(node, ast.Attribute) and reads_through_module(node.attr) and a.scope_of.get(node, "").split(".")[0] not in a.model_classes:
            if on_wrapper(node.value):
                yield node, None
        elif isinstance(node, ast.Subscript) and isinstance(node.value, (ast.Name, ast.Attribute)) and on_wrapper(node.value):
            yield node, None
    for call in calls_handed_the_model(a):
        whole = call.node.args[0] if call.node.args else None  # type: ignore[attr-defined]
        if isinstance(whole, (ast.Name, ast.Attribute)) and on_wrapper(whole):
            yield call, whole


def calls_handed_the_model(a: Anatomy) -> list:
    """The calls whose first argument is the model itself: by name (`torch.save`, `torch.jit.trace`) and a
    writer's `add_graph(model, inputs)`."""
    return a.calls_to(*INNER_MODEL_CALLS) + a.calls_on(ROLE_WRITER, *TRACING_WRITER_METHODS)
