"""Shared by DDP and DP: reach the user's model through `.module` once it is wrapped.

A wrapper (DDP or DataParallel) forwards calls and `parameters()`, but not the model's own methods
and attributes (`model.generate()`, `model.vocab`), and its `state_dict()` keys gain a `module.`
prefix. After the wrap those go through `.module`, so they work and checkpoints load into the
single-GPU script unchanged.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import ROLE_MODEL, Site
from ddpify.codemods.base import Transform

# What a wrapper answers for itself, the same as the wrapped model would.
WRAPPER_PASSTHROUGH = frozenset(
    {"train", "eval", "parameters", "named_parameters", "zero_grad", "requires_grad_", "no_sync",
     "module", "training", "forward", "to", "cuda", "cpu"}
)


class ModuleAccess(Transform):
    """Base for `.module` rewriting; subclasses name the wrapper's qualified name."""

    NAME = "module"
    DESCRIPTION = "Custom methods/attributes and state_dict() of a wrapped model go through `.module`."
    WRAPPER = ""

    def plan(self) -> None:
        wraps = self.anatomy.calls_to(self.WRAPPER)
        wrapped = {o for w in wraps if w.node.args for o in self.anatomy.origins(w.node.args[0], ROLE_MODEL)}  # type: ignore[attr-defined]
        if not wrapped:
            return
        for node in ast.walk(self.anatomy.tree):
            if self._needs_module(node, wrapped, wraps):
                self._insert_module(node)  # type: ignore[arg-type]
        for save in self.anatomy.calls_to("torch.save"):
            whole = save.node.args[0] if save.node.args else None  # type: ignore[attr-defined]
            if isinstance(whole, (ast.Name, ast.Attribute)) and self.anatomy.origins(whole, ROLE_MODEL) & wrapped and self._after_wrap(whole, wraps):
                self.rewrite_node(whole, type(_cst_name(whole)), _module_of)
                self.changed(save.line, f"torch.save({ast.unparse(whole)}) -> saves {ast.unparse(whole)}.module (the wrapper does not unpickle without a process group)")

    def _needs_module(self, node: ast.AST, wrapped: set, wraps: list[Site]) -> bool:
        if not isinstance(node, ast.Attribute) or node.attr in WRAPPER_PASSTHROUGH or node.attr.startswith("__"):
            return False
        if self.anatomy.scope_of.get(node, "").split(".")[0] in self.anatomy.model_classes:
            return False
        if not (self.anatomy.origins(node.value, ROLE_MODEL) & wrapped):
            return False
        return self._after_wrap(node, wraps)

    def _after_wrap(self, node: ast.AST, wraps: list[Site]) -> bool:
        """Is the access reached only once the model is wrapped?"""
        scope = self.anatomy.scope_of.get(node)
        line = node.lineno  # type: ignore[attr-defined]
        for wrap in wraps:
            if wrap.scope == scope:
                return line > wrap.stmt.end_lineno  # type: ignore[operator]
            if not self._only_called_before(scope, wrap):
                return True
        return False

    def _only_called_before(self, scope: str | None, wrap: Site) -> bool:
        calls = [c for c in self.anatomy.calls if self.anatomy.callee(c.node) == scope]  # type: ignore[arg-type]
        return bool(calls) and all(c.scope == wrap.scope and c.line < wrap.line for c in calls)

    def _insert_module(self, node: ast.Attribute) -> None:
        target = node.value
        self.rewrite_node(node, cst.Attribute, _through_module)
        self.changed(node.lineno, f"{ast.unparse(target)}.{node.attr} -> {ast.unparse(target)}.module.{node.attr}")


def _cst_name(expr: ast.AST) -> cst.CSTNode:
    return cst.Name("x") if isinstance(expr, ast.Name) else cst.Attribute(cst.Name("x"), cst.Name("y"))


def _module_of(node: cst.CSTNode) -> cst.CSTNode:
    return cst.Attribute(value=node, attr=cst.Name("module"))  # type: ignore[arg-type]


def _through_module(attr: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(attr, cst.Attribute)
    return attr.with_changes(value=cst.Attribute(value=attr.value, attr=cst.Name("module")))
