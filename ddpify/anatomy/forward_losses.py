"""A loss returned from a DataParallel model's forward, and where the training code takes it out.

Under `nn.DataParallel` a scalar loss that forward returns comes back as one loss per GPU: the
training code must reduce it (`.mean()`) before `backward()`. This module finds where forward
returns a loss (`LossReturn`), where a model call's result is read for it (`LossAccess`), and
whether those reads reduce it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterator

from ddpify.anatomy.forward import binds, forward_of
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, ModelSite
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.values import ROLE_CRITERION, ROLE_MODEL
from ddpify.anatomy.vocabulary import is_criterion_class, is_loss_function

# Where the loss sits in what forward returns: () the value itself, (1,) a tuple item, ("loss",) a dict item.
LossPath = tuple[int | str, ...]
_LOSS_NAME = re.compile(r"(^|_)loss(es)?($|_)")
_REDUCTIONS = frozenset({"mean", "sum"})


@dataclass(frozen=True)
class LossReturn:
    """Where forward returns a loss; `always` when every `return` of forward returns one."""

    forward: ast.FunctionDef
    paths: frozenset[LossPath]
    always: bool


@dataclass(frozen=True)
class LossAccess:
    """Where the training code takes a loss out of a model call's result.

    `node` is the expression that evaluates to the gathered per-GPU losses (the call, or
    `out["loss"]`), or, when `unpacked`, the name a tuple assignment `loss, logits = model(x)` binds.
    """

    node: ast.AST
    stmt: ast.stmt
    unpacked: bool = False


def loss_return(anatomy: Anatomy, forward: ast.FunctionDef) -> LossReturn | None:
    """Does `forward` return a loss, and where in its result?"""
    per_return = [_loss_paths(anatomy, r.value, forward) for r in return_statements(forward) if r.value is not None]
    paths = frozenset(p for found in per_return for p in found)
    if not paths:
        return None
    return LossReturn(forward, paths, always=all(per_return))


def return_statements(forward: ast.FunctionDef) -> Iterator[ast.Return]:
    return (n for n in walk_body(forward.body) if isinstance(n, ast.Return))


def _loss_paths(anatomy: Anatomy, value: ast.AST, forward: ast.FunctionDef) -> set[LossPath]:
    value = _local_value(value, forward)
    if isinstance(value, ast.Tuple):
        return {(i,) for i, item in enumerate(value.elts) if is_loss(anatomy, item, forward)}
    if isinstance(value, ast.Dict):
        return {
            (k.value,) for k, v in zip(value.keys, value.values)
            if isinstance(k, ast.Constant) and isinstance(k.value, str) and is_loss(anatomy, v, forward)
        }
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        return {(kw.arg,) for kw in value.keywords if kw.arg and is_loss(anatomy, kw.value, forward)}
    return {()} if is_loss(anatomy, value, forward) else set()


def _local_value(value: ast.AST, forward: ast.FunctionDef) -> ast.AST:
    """`out` in `out = {...}; return out` is the dict (or tuple) it was built as."""
    if not isinstance(value, ast.Name):
        return value
    built = _local_assignments(forward, value.id)
    is_container = len(built) == 1 and (isinstance(built[0], (ast.Tuple, ast.Dict)) or _is_dict_call(built[0]))
    return built[0] if is_container else value


def _is_dict_call(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "dict"


def is_loss(anatomy: Anatomy, expr: ast.AST, forward: ast.FunctionDef, _seen: frozenset[str] = frozenset()) -> bool:
    """Is `expr` (inside forward) a loss: a loss function or criterion call, a sum of losses, a `loss` variable?"""
    if isinstance(expr, ast.Name):
        if _LOSS_NAME.search(expr.id):
            return True
        seen = _seen | {expr.id}
        return expr.id not in _seen and any(is_loss(anatomy, v, forward, seen) for v in _local_assignments(forward, expr.id))
    if isinstance(expr, ast.BinOp):
        return is_loss(anatomy, expr.left, forward, _seen) or is_loss(anatomy, expr.right, forward, _seen)
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    if is_loss_function(anatomy.qualname(func) or "") or anatomy.has_role(func, ROLE_CRITERION):
        return True
    if isinstance(func, ast.Call):  # nn.MSELoss()(pred, y)
        return is_criterion_class(anatomy.qualname(func.func) or "")
    return isinstance(func, ast.Attribute) and func.attr in _REDUCTIONS and is_loss(anatomy, func.value, forward, _seen)


def _local_assignments(forward: ast.FunctionDef, name: str) -> list[ast.AST]:
    return [s.value for s in walk_body(forward.body) if isinstance(s, ast.Assign) and any(binds(t, name) for t in s.targets)]


def model_calls(anatomy: Anatomy) -> Iterator[tuple[ast.Call, list[str]]]:
    """Calls of a model (`model(x)`, `self.model(x)`) outside the model classes, with the model's
    classes (those of this file and those another file defines)."""
    for site in anatomy.calls:
        call: ast.Call = site.node  # type: ignore[assignment]
        if site.scope.split(".")[0] in anatomy.model_classes:
            continue
        classes = {o.class_name for o in anatomy.origins(call.func, ROLE_MODEL) if isinstance(o, ModelSite)}
        if classes:
            yield call, sorted(classes)


def model_losses(anatomy: Anatomy) -> list[tuple[ast.Call, LossAccess]]:
    """Each place training code takes a loss out of a model call: where forward (a class of this
    file) returns one, and, whatever the model's class, where the call's whole result is
    back-propagated (`loss = model(x)` then `loss.backward()`: forward returned a scalar)."""
    found: dict[ast.AST, tuple[ast.Call, LossAccess]] = {}
    for call, classes in model_calls(anatomy):
        for cls in classes:
            returned = loss_return(anatomy, forward_of(anatomy, cls)) if cls in anatomy.model_classes else None
            for access in loss_accesses(anatomy, call, returned) if returned is not None else ():
                found.setdefault(access.node, (call, access))
        if _backpropagated(anatomy, call):
            found.setdefault(call, (call, LossAccess(call, anatomy.stmt_of[call])))
    return list(found.values())


def _backpropagated(anatomy: Anatomy, call: ast.Call) -> bool:
    """Is the call's whole result back-propagated: `model(x).backward()`, or `loss = model(x)` and
    then `loss.backward()` (after arithmetic too: `(loss / accumulation).backward()`)?"""
    parent = anatomy.parents.get(call)
    if isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        return any(_is_backward_of(anatomy, read) for read in reads_after(anatomy, parent, parent.targets[0]))
    return _is_backward_of(anatomy, call)


def _is_backward_of(anatomy: Anatomy, expr: ast.AST) -> bool:
    """`expr.backward()` with no gradient given, around arithmetic (`(expr / n).backward()`)."""
    parent = anatomy.parents.get(expr)
    while isinstance(parent, (ast.BinOp, ast.UnaryOp)):
        expr, parent = parent, anatomy.parents.get(parent)
    call = anatomy.parents.get(parent) if isinstance(parent, ast.Attribute) and parent.attr == "backward" else None
    return isinstance(call, ast.Call) and call.func is parent and not call.args and not call.keywords


def loss_accesses(anatomy: Anatomy, call: ast.Call, returned: LossReturn) -> list[LossAccess]:
    """Where the loss is taken out of this model call's result (empty when the call returns none)."""
    if not returned.always and not _passes_every_parameter(call, returned.forward):
        return []
    stmt = anatomy.stmt_of[call]
    if () in returned.paths:
        return [LossAccess(call, stmt)]
    parent = anatomy.parents.get(call)
    if isinstance(parent, ast.Subscript) and _key(parent) in returned.paths:
        return [LossAccess(parent, stmt)]
    if not (isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1):
        return []
    target = parent.targets[0]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [
            LossAccess(item, parent, unpacked=True)
            for i, item in enumerate(target.elts) if (i,) in returned.paths and isinstance(item, ast.Name)
        ]
    if isinstance(target, ast.Name):
        reads = (anatomy.parents.get(n) for n in reads_after(anatomy, parent, target))
        return [LossAccess(r, anatomy.stmt_of[r]) for r in reads if isinstance(r, ast.Subscript) and _key(r) in returned.paths]
    return []


def _key(subscript: ast.Subscript) -> LossPath | None:
    key = subscript.slice
    if isinstance(key, ast.Constant) and isinstance(key.value, (int, str)) and not isinstance(key.value, bool):
        return (key.value,)
    return None


def _passes_every_parameter(call: ast.Call, forward: ast.FunctionDef) -> bool:
    """Does the call fill every parameter of forward (so it takes the branch that returns the loss)?"""
    params = [a.arg for a in (*forward.args.posonlyargs, *forward.args.args)][1:]
    given = set(params[: len(call.args)]) | {kw.arg for kw in call.keywords}
    return set(params) <= given


def reads_after(anatomy: Anatomy, stmt: ast.stmt, name: ast.Name) -> list[ast.Name]:
    """Reads of the variable `stmt` binds to `name`, after `stmt` and until it is bound again
    (the right-hand side of that rebinding, as in `loss = loss.mean()`, still reads it)."""
    ref = anatomy.ref(name)
    scope = anatomy.scope_of.get(name, MODULE_SCOPE)
    body = anatomy.tree.body if scope == MODULE_SCOPE else anatomy.functions[scope].node.body
    later = sorted(
        (n for n in walk_body(body) if isinstance(n, ast.Name) and n.id == name.id and _after(n, stmt) and anatomy.ref(n) == ref),
        key=source_position,
    )
    rebinding = min((anatomy.stmt_of[n] for n in later if isinstance(n.ctx, ast.Store)), key=source_position, default=None)
    return [
        n for n in later
        if isinstance(n.ctx, ast.Load)
        and (rebinding is None or source_position(n) < source_position(rebinding) or anatomy.stmt_of[n] is rebinding)
    ]


def source_position(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset  # type: ignore[attr-defined]


def _after(node: ast.AST, stmt: ast.stmt) -> bool:
    return source_position(node) > (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)


def is_reduced(anatomy: Anatomy, expr: ast.AST) -> bool:
    """Is `expr` immediately reduced: `expr.mean()` / `expr.sum()`?"""
    parent = anatomy.parents.get(expr)
    return (
        isinstance(parent, ast.Attribute)
        and parent.value is expr
        and parent.attr in _REDUCTIONS
        and isinstance(anatomy.parents.get(parent), ast.Call)
    )
