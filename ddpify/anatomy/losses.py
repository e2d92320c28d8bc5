"""How the loss a training step back-propagates reduces over the batch.

DDP averages gradients over the ranks, which keeps a per-sample mean a mean of the global batch;
a loss summed over the batch (`reduction='sum'`) becomes the ranks' mean of their sums, WORLD_SIZE
times smaller than the single-process sum over the same samples; and a mean over tokens (padding
ignored, a masked mean) becomes the ranks' mean of their token means, which weighs a rank's tokens
more when it has fewer of them.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.distributed.names import TORCH
from ddpify.anatomy.names import dotted_name
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.values import ROLE_CRITERION
from ddpify.anatomy.distributed.reaching import reaching_values, returned_values
from ddpify.anatomy.syntax import keyword
from ddpify.anatomy.vocabulary import is_criterion_class, is_loss_function

_MAX_DEPTH = 12
_SUM = "sum"
_FULL_REDUCTIONS = ("mean", _SUM)


def loss_terms(a: Anatomy, expr: ast.AST, depth: int = 0, by_hand: bool = False) -> list[ast.Call]:
    """The loss-function and criterion calls whose results flow into `expr`: through variables, the
    terms added to them (`loss += criterion(...)`), arithmetic, and the returns of this file's functions.
    `by_hand`: a loss written by hand, a mean or sum over all its elements (`((y_pred - y) ** 2).sum()`,
    `torch.mean(...)`), is a term too."""
    if depth > _MAX_DEPTH:
        return []
    if isinstance(expr, ast.Call):
        if _is_loss_call(a, expr) or (by_hand and full_reduction(a, expr) is not None):
            return [expr]
        callee = a.callee(expr)
        return [t for value in returned_values(a, callee) for t in loss_terms(a, value, depth + 1, by_hand)] if callee else []
    if isinstance(expr, ast.BinOp):
        return loss_terms(a, expr.left, depth + 1, by_hand) + loss_terms(a, expr.right, depth + 1, by_hand)
    if isinstance(expr, ast.UnaryOp):
        return loss_terms(a, expr.operand, depth + 1, by_hand)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        values = [*reaching_values(a, expr), *added_terms(a, expr)]
        return [t for value in values for t in loss_terms(a, value, depth + 1, by_hand)]
    return []


def added_terms(a: Anatomy, read: ast.Name | ast.Attribute) -> list[ast.expr]:
    """What `loss += term` (or `-=`) adds to the variable read here, in its scope, before the read."""
    ref = a.ref(read)
    scope = a.scope_of.get(read)
    return [b.stmt.value for b in bindings(a).get(ref, ()) if ref is not None
            and isinstance(b.stmt, ast.AugAssign) and isinstance(b.stmt.op, (ast.Add, ast.Sub))
            and a.scope_of.get(b.stmt) == scope and b.stmt.lineno < read.lineno]


def full_reduction(a: Anatomy, call: ast.Call) -> str | None:
    """"mean" or "sum" where the call averages or sums all the elements of one tensor (`x.sum()`,
    `torch.mean(x)`, no dimension given), else None."""
    if call.keywords:
        return None
    module, _, name = (a.qualname(call.func) or "").rpartition(".")
    if module == TORCH and name in _FULL_REDUCTIONS and len(call.args) == 1:
        return name
    method = isinstance(call.func, ast.Attribute) and call.func.attr in _FULL_REDUCTIONS and not call.args
    return call.func.attr if method and not _is_module(a, call.func.value) else None  # type: ignore[attr-defined]


def _is_module(a: Anatomy, expr: ast.AST) -> bool:
    """Is `expr` an imported name (`np` in `np.sum()`), not a value?"""
    dotted = dotted_name(expr)
    return dotted is not None and dotted.partition(".")[0] in a.names.aliases


def reduced_tensor(call: ast.Call) -> ast.expr:
    """`x` in `x.mean()` and in `torch.mean(x)` (a `full_reduction`)."""
    return call.args[0] if call.args else call.func.value  # type: ignore[attr-defined]


def sums_over_batch(a: Anatomy, call: ast.Call) -> bool | None:
    """Does this loss call sum over the batch (`reduction='sum'`, or the old `size_average=False`, given
    here or to its criterion, or a sum written by hand)? None when a reduction is chosen at run time
    (`reduction=args.reduction`)."""
    reduced = full_reduction(a, call)
    if reduced is not None:
        return reduced == _SUM
    calls = [call]
    if isinstance(call.func, (ast.Name, ast.Attribute)) and a.has_role(call.func, ROLE_CRITERION):
        calls += [v for v in reaching_values(a, call.func) if isinstance(v, ast.Call)]
    elif isinstance(call.func, ast.Call):  # nn.MSELoss(reduction="sum")(pred, y)
        calls.append(call.func)
    given = [k.value for c in calls for k in (keyword(c, "reduction"),) if k is not None]
    legacy = [k.value for c in calls for k in (keyword(c, "size_average"),) if k is not None]  # before torch 0.4.1
    if any(isinstance(v, ast.Constant) and v.value == _SUM for v in given) or any(_is_false(v) for v in legacy):
        return True
    return None if any(not isinstance(v, ast.Constant) for v in [*given, *legacy]) else False


def _is_false(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is False


def token_mean(a: Anatomy, loss: ast.AST) -> str | None:
    """How `loss` averages over a count that differs between ranks (its tokens, not its samples):
    `ignore_index=` on a cross-entropy (the mean over the tokens not ignored), or a sum divided by a
    count it takes (`(loss * mask).sum() / mask.sum()`); None when it does not."""
    for term in loss_terms(a, loss):
        if _ignores_tokens(a, term):
            return f"{ast.unparse(term.func)}(..., ignore_index=...) averages over this rank's tokens that are not ignored"
    divided = _divided_by_count(a, loss)
    return f"{ast.unparse(divided)} averages over a count taken from this rank's batch" if divided is not None else None


def _ignores_tokens(a: Anatomy, call: ast.Call) -> bool:
    keywords = [keyword(call, "ignore_index")]
    if isinstance(call.func, (ast.Name, ast.Attribute)) and a.has_role(call.func, ROLE_CRITERION):
        keywords += [keyword(v, "ignore_index") for v in reaching_values(a, call.func) if isinstance(v, ast.Call)]
    elif isinstance(call.func, ast.Call):
        keywords.append(keyword(call.func, "ignore_index"))
    return any(k is not None for k in keywords)


def _divided_by_count(a: Anatomy, expr: ast.AST, depth: int = 0) -> ast.BinOp | None:
    """`x / m.sum()` (or `/ lengths.sum()`, `/ n_tokens` bound to such a sum) reaching `expr`."""
    if depth > _MAX_DEPTH:
        return None
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) and _is_count(a, expr.right, depth):
        return expr
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return next((d for v in reaching_values(a, expr) if (d := _divided_by_count(a, v, depth + 1)) is not None), None)
    return None


def _is_count(a: Anatomy, expr: ast.AST, depth: int) -> bool:
    """A `.sum()` of a mask or lengths (or a variable bound to one, maybe clamped or cast)."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        if expr.func.attr == "sum" and not expr.args:
            return True
        if expr.func.attr in ("clamp", "clamp_min", "float", "item"):
            return _is_count(a, expr.func.value, depth)
    if isinstance(expr, ast.Name) and depth < _MAX_DEPTH:
        return any(_is_count(a, v, depth + 1) for v in reaching_values(a, expr))
    return False


def _is_loss_call(a: Anatomy, call: ast.Call) -> bool:
    func = call.func
    if is_loss_function(a.qualname(func) or "") or a.has_role(func, ROLE_CRITERION):
        return True
    return isinstance(func, ast.Call) and is_criterion_class(a.qualname(func.func) or "")
