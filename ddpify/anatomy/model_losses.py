"""A loss the model returns, computed in its forward from the whole batch: can the ranks share its rows?

`logits, loss = model(X, Y)` with a forward that ends `loss = F.cross_entropy(logits.view(-1, V),
targets.view(-1))` is a mean over the rows of its targets: each rank can call the model on its rows
of the batch (every WORLD_SIZE-th) and weight the loss by its share of the rows, as rows.py does for
a loss this file computes. With `ignore_index=` the mean is over the targets not ignored, so the
weight is this rank's share of those targets. Exact as long as each row's output depends on that
row alone: refused where a model may hold BatchNorm (batch statistics), where a class the model may
be returns its loss otherwise, or where the call's other outputs are read later (they would be
this rank's rows only).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.forward import forward_of
from ddpify.anatomy.forward_losses import loss_return, model_calls, reads_after, return_statements
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.syntax import keyword
from ddpify.anatomy.values import ROLE_MODEL
from ddpify.anatomy.vocabulary import is_loss_function

_RESHAPES = ("view", "reshape", "flatten", "contiguous")
_NOT_A_ROW_MEAN = ("weight", "reduction", "reduce", "size_average", "label_smoothing")


@dataclass(frozen=True)
class ModelRowLoss:
    """`model(X, Y)` whose returned loss the ranks can share by rows: the loss's place in what forward returns
    (None: forward returns the loss itself), the position of the targets among the call's arguments, and the
    target value a token mean ignores (`ignore_index=`), if any."""

    call: ast.Call
    at: int | None
    targets: int
    ignored: ast.expr | None


def model_row_loss(a: Anatomy, loss: ast.expr) -> ModelRowLoss | str | None:
    """How the ranks share the rows of `loss` where a model call returns it; why not (a str); None where no
    model call returns it."""
    found = _model_call_of(a, loss)
    if found is None:
        return None
    call, at, stmt = found
    classes = next((classes for c, classes in model_calls(a) if c is call), [])
    if call.keywords or any(isinstance(arg, ast.Starred) for arg in call.args):
        return f"`{ast.unparse(call)}` passes its arguments by name or unpacked"
    if not classes or any(c not in a.model_classes for c in classes):
        return "the model's class is defined in another file, whose forward computes the loss"
    if any(site.has_batchnorm is not False for site in a.trained_models):
        return "the model may hold BatchNorm, whose batch statistics differ on a rank's rows"
    if at is not None and _other_outputs_read(a, stmt, at):
        return f"`{ast.unparse(stmt)}` reads the model's other outputs too, which would be this rank's rows only"
    shares = [_row_mean(a, forward_of(a, cls), call, at) for cls in classes]
    why = next((s for s in shares if isinstance(s, str)), None)
    if why or len({(t, ast.unparse(i) if i else None) for t, i in shares}) != 1:  # type: ignore[misc]
        return why or "the model's classes compute their losses from different arguments"
    targets, ignored = shares[0]  # type: ignore[misc]
    return ModelRowLoss(call, at, targets, ignored)


def _model_call_of(a: Anatomy, loss: ast.expr) -> tuple[ast.Call, int | None, ast.stmt] | None:
    """`model(X, Y)` whose result (or an item of it: `at`) `loss` reads, and the statement binding it."""
    if isinstance(loss, ast.Call):
        return (loss, None, a.stmt_of[loss]) if a.has_role(loss.func, ROLE_MODEL) else None
    ref = a.ref(loss)
    bound = [b.stmt for b in bindings(a).get(ref, ()) if b.stmt.lineno <= loss.lineno] if ref is not None else []
    stmt = bound[-1] if bound else None
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call)
            and a.has_role(stmt.value.func, ROLE_MODEL)):
        return None
    target = stmt.targets[0]
    if isinstance(target, ast.Name):
        return stmt.value, None, stmt
    names = [e.id if isinstance(e, ast.Name) else None for e in getattr(target, "elts", [])]
    return (stmt.value, names.index(loss.id), stmt) if isinstance(loss, ast.Name) and loss.id in names else None


def _other_outputs_read(a: Anatomy, stmt: ast.Assign, at: int) -> bool:
    others = [e for i, e in enumerate(stmt.targets[0].elts) if i != at]  # type: ignore[attr-defined]
    return any(not isinstance(e, ast.Name) or reads_after(a, stmt, e) for e in others)


def _row_mean(a: Anatomy, forward: ast.FunctionDef | None, call: ast.Call, at: int | None) -> tuple[int, ast.expr | None] | str:
    """(position of the targets among the call's arguments, ignored target value) where forward returns, at `at`,
    a loss function's plain mean over rows of targets the call passes; else why not."""
    returned = loss_return(a, forward) if forward is not None else None
    if returned is None or returned.paths != {(at,) if at is not None else ()}:
        return "the model returns its loss in another place of its result, or not always"
    losses = {id(v): v for r in return_statements(forward) for v in _loss_values(a, forward, r.value, at)}  # type: ignore[arg-type]
    if len(losses) != 1:
        return "forward computes its loss in more than one way, or not by one loss function's call"
    (loss,) = losses.values()
    if not isinstance(loss, ast.Call):
        return "forward computes its loss by no loss function's call"
    other = next((k for k in _NOT_A_ROW_MEAN if keyword(loss, k) is not None), None)
    if other or len(loss.args) != 2:
        return f"{ast.unparse(loss.func)}(...) in forward is no plain mean over the rows of its targets" + (f" (it takes {other}=)" if other else "")
    params = [p.arg for p in forward.args.args][1:]  # type: ignore[union-attr]
    target = _unshaped(loss.args[1])
    if not (isinstance(target, ast.Name) and target.id in params and params.index(target.id) < len(call.args)):
        return f"the targets of {ast.unparse(loss.func)}(...) in forward are no argument the model call passes by position"
    ignored = keyword(loss, "ignore_index")
    return params.index(target.id), ignored.value if ignored is not None else None


def _loss_values(a: Anatomy, forward: ast.FunctionDef, value: ast.expr | None, at: int | None) -> list[ast.Call | ast.AST]:
    """The loss function calls the returned loss (at `at` of the returned tuple) is assigned from in forward."""
    item = value.elts[at] if at is not None and isinstance(value, ast.Tuple) and at < len(value.elts) else value
    if isinstance(item, ast.Name):
        assigned = [s.value for s in ast.walk(forward) if isinstance(s, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == item.id for t in s.targets)]
        values = [v for v in assigned if not (isinstance(v, ast.Constant) and v.value is None)]
    else:
        values = [item]
    return [v if isinstance(v, ast.Call) and is_loss_function(a.qualname(v.func) or "") else ast.Pass() for v in values]


def _unshaped(expr: ast.expr) -> ast.expr:
    """`targets` in `targets.view(-1)` (or `.reshape(...)`, `.flatten()`)."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _RESHAPES:
        expr = expr.func.value
    return expr
