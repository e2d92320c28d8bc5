"""Shared by DDP and DP: reach the user's model through `.module` once it is wrapped.

A wrapper (DDP or DataParallel) forwards calls and `parameters()`, but not the model's own methods
and attributes (`model.generate()`, `model.vocab`), and its `state_dict()` keys gain a `module.`
prefix. After the wrap those go through `.module`, so they work and checkpoints load into the
single-GPU script unchanged; so do indexing (`net[0]`: a wrapper has no items) and the calls that
mean the model itself (`torch.save(model)`, `copy.deepcopy(model)`).
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import ROLE_MODEL
from ddpify.anatomy import distributed as ddp
from ddpify.anatomy.vocabulary import WHOLE_MODEL_CALLS, reads_through_module
from ddpify.codemods.base import Transform


class ModuleAccess(Transform):
    """Base for `.module` rewriting; subclasses name the wrapper's qualified name."""

    NAME = "module"
    DESCRIPTION = "Custom methods/attributes and state_dict() of a wrapped model go through `.module`."
    SEES_EDITS_OF = ("wrap",)  # the wrapper it reaches through
    WRAPPER = ""

    def plan(self) -> None:
        if not self.anatomy.calls_to(self.WRAPPER) and not self.anatomy.wrapped_elsewhere:
            return
        for node in self.anatomy.nodes:
            if self._needs_module(node):
                self._insert_module(node)  # type: ignore[arg-type]
            elif isinstance(node, ast.Subscript) and isinstance(node.value, (ast.Name, ast.Attribute)) and self._on_wrapper(node.value):
                self._index_module(node)
        for call in self.anatomy.calls_to(*WHOLE_MODEL_CALLS):
            whole = call.node.args[0] if call.node.args else None  # type: ignore[attr-defined]
            if isinstance(whole, (ast.Name, ast.Attribute)) and self._on_wrapper(whole):
                self._unwrap(whole)
                name = ast.unparse(whole)
                self.changed(call.line, f"{call.qualname}({name}) -> {WHOLE_MODEL_CALLS[call.qualname].format(name)}")

    def _needs_module(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Attribute) or not reads_through_module(node.attr):
            return False
        if self.anatomy.scope_of.get(node, "").split(".")[0] in self.anatomy.model_classes:
            return False
        return self._on_wrapper(node.value)

    def _on_wrapper(self, expr: ast.AST) -> bool:
        """Does `expr` hold the wrapper where it is read (judged as the lint rules judge it), or a
        model another file of the project hands in already wrapped?"""
        if self.anatomy.origins(expr, ROLE_MODEL) & self.anatomy.wrapped_elsewhere:  # type: ignore[operator]
            return True
        return ddp.is_wrapper(self.anatomy, expr, self.WRAPPER)

    def _unwrap(self, expr: ast.expr) -> None:
        self.rewrite_expression(expr, module_of)

    def _index_module(self, node: ast.Subscript) -> None:
        """`net[0]`: a wrapper has no items (`nn.Sequential`, `nn.ModuleList`), its module has."""
        self._unwrap(node.value)
        name = ast.unparse(node.value)
        self.changed(node.lineno, f"{name}[...] -> {name}.module[...]")

    def _insert_module(self, node: ast.Attribute) -> None:
        target = node.value
        self.rewrite_node(node, cst.Attribute, _through_module)
        self.changed(node.lineno, f"{ast.unparse(target)}.{node.attr} -> {ast.unparse(target)}.module.{node.attr}")


def module_of(node: cst.CSTNode) -> cst.CSTNode:
    """`model` -> `model.module`: the model inside its wrapper."""
    return cst.Attribute(value=node, attr=cst.Name("module"))  # type: ignore[arg-type]


def _through_module(attr: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(attr, cst.Attribute)
    return attr.with_changes(value=cst.Attribute(value=attr.value, attr=cst.Name("module")))
