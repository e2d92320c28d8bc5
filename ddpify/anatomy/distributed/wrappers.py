"""DDP (and DataParallel) wrappers: the wrap calls, whether an expression evaluates to a wrapper or the
module inside it, the constructor calls a model comes from, and gradient-sync skipping (`no_sync`).
"""

from __future__ import annotations

import ast
from typing import Callable

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.values import ROLE_MODEL
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.accelerate import accelerator_attribute
from ddpify.anatomy.distributed.names import FULLY_SHARD, SYNC_BATCHNORM_CONVERT
from ddpify.anatomy.distributed.reaching import MAX_DEPTH, assignments, reaching_values, returned_values
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite
from ddpify.anatomy.syntax import argument, method_name
from ddpify.anatomy.vocabulary import ACCELERATOR_SYNC_SKIPS, DDP_WRAPPER, MODULE_RETURNING_SELF


@per_anatomy
def wrap_calls(a: Anatomy) -> list[CallSite]:
    """Every `DistributedDataParallel(model, ...)` call."""
    return a.calls_to(DDP_WRAPPER)


def wrapped_module(call: ast.Call) -> ast.AST | None:
    return argument(call, 0, "module")


def is_wrapper(a: Anatomy, expr: ast.AST, wrapper: str = DDP_WRAPPER, depth: int = 0) -> bool:
    """Does `expr` evaluate to a `wrapper` (DDP, or DataParallel), not the module inside it?"""
    def wrapped(named: ast.AST, at_depth: int) -> bool:
        if not a.has_role(named, ROLE_MODEL) or not _wrap_calls_of(a, wrapper):
            return False
        return any(is_wrapper(a, v, wrapper, at_depth + 1) for v in reaching_values(a, named))

    return _evaluates_to(a, expr, wrapper, wrapped, depth)


def wrapper_or_plain(a: Anatomy, expr: ast.AST, wrapper: str = DDP_WRAPPER, depth: int = 0) -> bool:
    """Is `expr` a `wrapper` where some values reach it, and a model that is not one where others do?
    A variable rebound after the wrap (`model = torch.load(f)`: the best model reloaded, then
    evaluated by the function that evaluated the wrapper), or a parameter that some callers hand a
    wrapper and others do not: `.module` fails on the plain model."""
    if depth > MAX_DEPTH or not isinstance(expr, (ast.Name, ast.Attribute)):
        return False
    values = reaching_values(a, expr)
    wrapped = [v for v in values if is_wrapper(a, v, wrapper)]
    if not wrapped:
        return False
    assigned = assignments(a).get(a.ref(expr), [])  # type: ignore[arg-type]
    statements = {id(v): s for s, v in assigned}
    wraps = [s for s, v in assigned if v in wrapped]
    return any(wrapper_or_plain(a, v, wrapper, depth + 1) or
               (v not in wrapped and _outlives_the_wrap(a, statements.get(id(v)), wraps))
               for v in values)


def _outlives_the_wrap(a: Anatomy, stmt: ast.stmt | None, wraps: list[ast.stmt]) -> bool:
    """Does a plain value reach the read past the wrap: a caller's argument (`stmt` None), or an
    assignment after a wrap of its scope that no later wrap there overwrites?"""
    if stmt is None:
        return True
    scope = a.scope_of.get(stmt, MODULE_SCOPE)
    lines = [w.lineno for w in wraps if a.scope_of.get(w, MODULE_SCOPE) == scope]
    return any(line < stmt.lineno for line in lines) and not any(line > stmt.lineno for line in lines)


def may_become_wrapper(a: Anatomy, expr: ast.AST, wrapper: str = DDP_WRAPPER) -> bool:
    """Before the wrap: could `expr` evaluate to a `wrapper` once the models are wrapped (does it hold a model)?"""
    return _evaluates_to(a, expr, wrapper, lambda named, _: a.has_role(named, ROLE_MODEL), 0)


def _evaluates_to(a: Anatomy, expr: ast.AST, wrapper: str, named: Callable[[ast.AST, int], bool], depth: int) -> bool:
    """Does `expr` evaluate to a `wrapper`, a variable or attribute judged by `named`? Seen through
    `torch.compile`, methods that return the module, helpers' returns and conditionals."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(expr, ast.Call):
        q = a.qualname(expr.func)
        if q == wrapper:
            return True
        if q == "torch.compile" and expr.args:
            return _evaluates_to(a, expr.args[0], wrapper, named, depth + 1)
        if method_name(expr) in MODULE_RETURNING_SELF:
            return _evaluates_to(a, expr.func.value, wrapper, named, depth + 1)  # type: ignore[attr-defined]
        callee = a.callee(expr)
        if callee is None or unwrapping_function(a, callee):
            return False
        return any(_evaluates_to(a, v, wrapper, named, depth + 1) for v in returned_values(a, callee))
    if isinstance(expr, ast.IfExp):
        if _unwraps(expr):
            return False
        return _evaluates_to(a, expr.body, wrapper, named, depth + 1) or _evaluates_to(a, expr.orelse, wrapper, named, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return named(expr, depth)
    return False


def _wrap_calls_of(a: Anatomy, wrapper: str) -> list[CallSite]:
    return wrap_calls(a) if wrapper == DDP_WRAPPER else a.calls_to(wrapper)


def unwrapping_function(a: Anatomy, function: str) -> bool:
    """A function that returns a wrapper's `.module` on some path (ddpify's `evaluation_module`):
    what it hands back is the plain model, or a value that was never wrapped."""
    return any(isinstance(v, ast.Attribute) and v.attr == "module" for v in returned_values(a, function))


def _unwraps(expr: ast.IfExp) -> bool:
    """`model.module if distributed else model`: the plain model on either branch."""
    for inner, other in ((expr.body, expr.orelse), (expr.orelse, expr.body)):
        if isinstance(inner, ast.Attribute) and inner.attr == "module" and ast.dump(inner.value) == ast.dump(other):
            return True
    return False


def model_origins(a: Anatomy, expr: ast.AST, depth: int = 0) -> set[ast.Call] | None:
    """The constructor calls (`Net()`) whose model `expr` holds, seen through DDP wrappers,
    `.to()` chains and variables; None when some value can't be traced."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(expr, ast.Call):
        q = a.qualname(expr.func) or ""
        if a.is_model_constructor(q):
            return {expr}
        if q in (DDP_WRAPPER, "torch.compile", SYNC_BATCHNORM_CONVERT) or q in FULLY_SHARD:
            inner = argument(expr, 0, "module")
            return model_origins(a, inner, depth + 1) if inner is not None else None
        if method_name(expr) in MODULE_RETURNING_SELF:
            return model_origins(a, expr.func.value, depth + 1)  # type: ignore[attr-defined]
        callee = a.callee(expr)
        return _union(a, returned_values(a, callee), depth) if callee else None
    if isinstance(expr, ast.IfExp):
        return _union(a, [expr.body, expr.orelse], depth)
    if isinstance(expr, ast.Attribute) and expr.attr == "module":
        return model_origins(a, expr.value, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return _union(a, reaching_values(a, expr), depth)
    return None


def _union(a: Anatomy, exprs: list[ast.AST], depth: int) -> set[ast.Call] | None:
    if not exprs:
        return None
    found: set[ast.Call] = set()
    for e in exprs:
        origins = model_origins(a, e, depth + 1)
        if origins is None:
            return None
        found |= origins
    return found


@per_anatomy
def wrapped_origins(a: Anatomy) -> set[ast.Call]:
    """The constructor calls of every model that some DDP wrapper wraps."""
    found: set[ast.Call] = set()
    for site in wrap_calls(a):
        inner = wrapped_module(site.node)  # type: ignore[arg-type]
        found |= (model_origins(a, inner) or set()) if inner is not None else set()
    return found


@per_anatomy
def uses_no_sync(a: Anatomy) -> bool:
    """Does the script skip gradient sync anywhere (`model.no_sync()`, `require_backward_grad_sync`,
    Accelerate's `accelerator.no_sync(model)` and `accelerator.accumulate(model)`)?"""
    return any(
        n.attr in ("no_sync", "require_backward_grad_sync") or accelerator_attribute(a, n) in ACCELERATOR_SYNC_SKIPS
        for n in a.nodes_of(ast.Attribute)
    )
