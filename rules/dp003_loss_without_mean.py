"""DP003: a loss returned by `forward` used without `.mean()` under DataParallel."""

from __future__ import annotations

import ast
from typing import Iterator

from ddpify.anatomy.forward_losses import LossAccess, is_reduced, model_losses, reads_after
from ddpify.edits.expressions import mean_of
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit
from ddpify.rules._dp import is_dp_wrapper

_SCALAR_METHODS = frozenset({"backward", "item"})
_MAX_HOPS = 4


class LossWithoutMean(Rule, code="DP003", name="loss-without-mean", severity="error"):
    """## What it does
    Flags `.backward()`, `.item()` and `float(...)` on a loss that the model's `forward` returns
    (alone, in a tuple, or in a dict) when the model is wrapped in `nn.DataParallel`, unless the
    loss is averaged first. A model whose output is back-propagated whole returns a loss too,
    however forward computes it (and wherever its class is defined). The loss is followed through variables and arithmetic
    (`loss = loss / accumulation_steps`, `(loss + aux).backward()`).

    ## Why is this bad?
    Each replica computes the loss of its own part of the batch, and DataParallel gathers the
    replicas' outputs: a scalar loss comes back as a vector with one loss per GPU.
    `loss.backward()` then fails with "grad can be implicitly created only for scalar outputs" and
    `loss.item()` with "a Tensor with 2 elements cannot be converted to Scalar". With one GPU, or
    on CPU, the loss stays a scalar and the bug hides until the script runs on several GPUs.

    ## Example
    ```python
    model = nn.DataParallel(ModelWithLoss())
    loss = model(x, y)
    loss.backward()
    ```

    ## Use instead
    ```python
    loss = model(x, y).mean()  # one loss per GPU
    loss.backward()
    ```

    ## Fix safety
    The fix inserts `.mean()` at the use. It is unsafe: when the per-GPU losses are not averages
    over equally large parts of the batch (a sum, or a last batch that splits unevenly) the mean
    weighs the samples differently than the single-GPU loss did.
    """

    message = "forward() returns a loss, and DataParallel gathers one per GPU: average it with .mean() first"

    def check(self, a):
        for call, access in model_losses(a):
            if is_dp_wrapper(a, call.func):
                for use in _unreduced_uses(a, access):
                    edit = expression_edit(a, use, mean_of)  # type: ignore[arg-type]
                    fix = Fix((edit,), safe=False, description="average the per-GPU losses") if edit else None
                    yield Finding(a.pos(use), fix=fix)


def _unreduced_uses(a, access: LossAccess) -> Iterator[ast.AST]:
    """The expressions holding the gathered losses where they are used as one scalar, following
    them through arithmetic (`loss / accumulation`) and the variables that hold the result."""
    if access.unpacked:
        pending: list[ast.AST] = list(reads_after(a, access.stmt, access.node))  # type: ignore[arg-type]
    elif is_reduced(a, access.node):
        return
    else:
        pending = [access.node]
    for _ in range(_MAX_HOPS):
        following: list[ast.AST] = []
        for holder in pending:
            outer = _through_arithmetic(a, holder)
            if _used_as_scalar(a, outer):
                yield holder
            elif (name := _bound_name(a, outer)) is not None:
                following += [r for r in reads_after(a, a.stmt_of[outer], name) if not is_reduced(a, r)]
        if not following:
            return
        pending = following


def _through_arithmetic(a, expr: ast.AST) -> ast.AST:
    """The largest `loss / n`, `loss + aux`, `-loss` around `expr`."""
    parent = a.parents.get(expr)
    while isinstance(parent, (ast.BinOp, ast.UnaryOp)):
        expr, parent = parent, a.parents.get(parent)
    return expr


def _bound_name(a, expr: ast.AST) -> ast.Name | None:
    """`loss` in `loss = <expr>`."""
    stmt = a.parents.get(expr)
    if isinstance(stmt, ast.Assign) and stmt.value is expr and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0]
    return None


def _used_as_scalar(a, expr: ast.AST) -> bool:
    parent = a.parents.get(expr)
    if isinstance(parent, ast.Attribute) and parent.attr in _SCALAR_METHODS:
        return isinstance(a.parents.get(parent), ast.Call)
    return isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "float" and expr in parent.args


_HEAD = """import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x, y):
        pred = self.fc(x)
{returns}


model = nn.DataParallel(Net())
x, y = torch.randn(8, 4), torch.randn(8, 1)
"""
_SCALAR = _HEAD.format(returns="        return F.mse_loss(pred, y)")
_TUPLE = _HEAD.format(returns="        return F.mse_loss(pred, y), pred")
_REDUCED = _HEAD.format(returns="        return ((pred - y) ** 2).mean()")  # no loss function: known by its backward()
_DICT = _HEAD.format(returns='        return {"loss": F.mse_loss(pred, y), "pred": pred}')

LossWithoutMean.VALID = (
    _SCALAR + "loss = model(x, y).mean()\nloss.backward()\nprint(loss.item())\n",
    _TUPLE + "loss, pred = model(x, y)\nloss = loss.mean()\nloss.backward()\n",
    _DICT + 'out = model(x, y)\nout["loss"].mean().backward()\nprint(out["pred"].sum().item())\n',
    # the plain model inside the wrapper returns one scalar
    _SCALAR + "model.module(x, y).backward()\n",
)
LossWithoutMean.INVALID = (
    Invalid.fixed_by(_SCALAR + "loss = model(x, y)\nloss.backward()\n", old="loss.backward", new="loss.mean().backward"),
    Invalid.fixed_by(_TUPLE + 'loss, pred = model(x, y)\nprint(f"loss {loss.item():.4f}")\n', old="loss.item", new="loss.mean().item"),
    Invalid.fixed_by(_DICT + 'out = model(x, y)\nout["loss"].backward()\n', old='out["loss"].backward', new='out["loss"].mean().backward'),
    Invalid.fixed_by(_SCALAR + "loss = model(x, y)\nloss = loss / 4\nloss.backward()\n", old="loss.backward", new="loss.mean().backward"),
    # forward's own arithmetic (a diffusion model's MSE): its output is back-propagated whole, so it is a loss
    Invalid.fixed_by(_REDUCED + "loss = model(x, y)\nloss.backward()\n", old="loss.backward", new="loss.mean().backward"),
)
