"""Loss terms that pair the batch's rows with each other, which DDP cannot split by rows.

Under DDP each rank computes the loss on its own rows of the batch and the ranks average their gradients.
That is the whole batch's gradient for a loss made of one term per row; a term over every pair of rows is
not: an energy-based GAN's pull-away term (`unit @ unit.t()`), a contrastive loss's `z1 @ z2.T` logits, a
distance matrix `torch.cdist(x, x)` or rows broadcast against rows (`x[:, None] - x[None]`). Each rank pairs
its own rows only, so the ranks' mean misses the pairs across ranks (verify sees it at run time:
verify/harness.py `watch_batch_pairs`).

`batch_pairs` finds such products where a backward's loss is computed (the functions of this file it calls
included, the models' own methods not: attention pairs a sample's tokens, not the batch's rows): a product
of a tensor by the transpose of another (`.t()`, `.T`, `.transpose(0, 1)`) or rows broadcast against rows,
whose two sides both come from the batch (a training loader's rows or a model's output for them), neither
from a parameter (`x @ self.weight.t()` is a layer) nor from rows already gathered from every rank
(`torch.distributed.nn.functional.all_gather`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator

from ddpify.anatomy.bindings import Binding, bindings
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.accelerate import accelerator_method
from ddpify.anatomy.distributed.names import TORCH
from ddpify.anatomy.distributed.reaching import reaching_values, returned_values
from ddpify.anatomy.full_batch import backward_loss
from ddpify.anatomy.losses import added_terms
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE
from ddpify.anatomy.syntax import constant, method_name
from ddpify.anatomy.values import ROLE_LOADER, ROLE_MODEL

_MAX_DEPTH = 12
_PRODUCTS = frozenset({"matmul", "mm", "bmm"})  # torch.matmul(a, b) and a.matmul(b)
_DISTANCES = frozenset({"cdist"})  # torch.cdist(a, b): every row of a by every row of b
_GATHERS = frozenset({"all_gather", "all_gather_into_tensor", "gather", "gather_for_metrics"})
_BROADCAST_OPERATORS = (ast.Sub, ast.Add, ast.Mult, ast.Div)  # x[:, None] - x[None]
_PAIRING_OPERATORS = (ast.MatMult, *_BROADCAST_OPERATORS)
_VIEWS = (ast.Subscript, ast.Call)  # how `x[None]` and `x.unsqueeze(0)` are spelled
_ROWS, _COLUMNS = 0, 1  # where `x[None]` / `x.unsqueeze(0)` and `x[:, None]` / `x.unsqueeze(1)` put a new dim


@dataclass(frozen=True)
class BatchPair:
    """A product (or difference) in a loss that pairs each of the batch's rows with each other row."""

    node: ast.expr
    rows: ast.expr  # one side of it, the batch's rows
    others: ast.expr  # the other side, whose rows it pairs them with

    @property
    def line(self) -> int:
        return self.node.lineno

    @property
    def code(self) -> str:
        return ast.unparse(self.node)


@per_anatomy
def batch_pairs(a: Anatomy) -> tuple[BatchPair, ...]:
    """The products that pair the batch's rows with each other in the loss of a backward, in source order."""
    backwards = _backward_calls(a)
    shaped = [(node, sides) for node in a.nodes if _may_pair(node) and (sides := _sides(a, node))] if backwards else []
    if not shaped:
        return ()  # most scripts
    upstream = {node for call in backwards for node in _upstream(a, _loss_of(a, call))}
    found = [BatchPair(node, *sides) for node, sides in shaped if node in upstream and all(_from_batch(a, side) for side in sides)]
    return tuple(sorted(found, key=lambda pair: (pair.node.lineno, pair.node.col_offset)))


def _backward_calls(a: Anatomy) -> list[ast.Call]:
    return [site.node for site in a.training_calls if method_name(site.node) == "backward"]  # type: ignore[misc]


def _loss_of(a: Anatomy, backward: ast.Call) -> ast.expr:
    """`loss` in `loss.backward()`, `scaler.scale(loss).backward()` and `accelerator.backward(loss)`."""
    if accelerator_method(a, backward) == "backward" and backward.args:
        return backward.args[0]
    return backward_loss(a, backward.func.value)  # type: ignore[attr-defined]


def _upstream(a: Anatomy, expr: ast.AST, seen: set[ast.AST] | None = None, depth: int = 0) -> Iterator[ast.AST]:
    """Every node whose value flows into `expr`: its own nodes, the values its variables hold and what the
    functions of this file it calls return (not a model's methods, nor anything past a gather of every rank's
    rows). A parameter (`self.weight`, `model.fc.weight`) is a leaf."""
    seen = set() if seen is None else seen
    if expr in seen or depth > _MAX_DEPTH:
        return
    seen.add(expr)
    yield expr
    if _gathers(a, expr) or _of_a_model(a, expr):
        return
    for child in ast.iter_child_nodes(expr):
        yield from _upstream(a, child, seen, depth)
    for value in _values_reaching(a, expr):
        yield from _upstream(a, value, seen, depth + 1)


def _values_reaching(a: Anatomy, expr: ast.AST) -> list[ast.AST]:
    """What a read of a variable may hold (the call unpacked in `out, emb = model(x)`, the iterable of a loop
    variable, the terms `+=` adds), or what a call of this file's function returns."""
    if isinstance(expr, ast.Call):
        callee = a.callee(expr)
        return returned_values(a, callee) if callee and callee.split(".")[0] not in a.model_classes else []
    if not isinstance(expr, (ast.Name, ast.Attribute)) or not isinstance(expr.ctx, ast.Load):
        return []
    bound = _binding_before(a, expr)
    if bound is not None and isinstance(bound.stmt, (ast.For, ast.AsyncFor)):
        return [bound.stmt.iter]
    if bound is not None and bound.value is None and isinstance(bound.stmt, ast.Assign):
        return [bound.stmt.value]
    return [*reaching_values(a, expr), *added_terms(a, expr)]


def _binding_before(a: Anatomy, read: ast.Name | ast.Attribute) -> Binding | None:
    """The last binding of the variable read here, in its scope, before the read."""
    ref = a.ref(read)
    scope = a.scope_of.get(read, MODULE_SCOPE)
    before = [b for b in bindings(a).get(ref, ()) if ref is not None and a.scope_of.get(b.stmt, MODULE_SCOPE) == scope
              and b.stmt.lineno < read.lineno]
    return before[-1] if before else None


def _of_a_model(a: Anatomy, expr: ast.AST) -> bool:
    """`model.fc.weight`, `self.weight`: an attribute of a model or of `self` (a parameter, a buffer, a layer)."""
    if not isinstance(expr, ast.Attribute):
        return False
    root = expr.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and (root.id == "self" or a.has_role(root, ROLE_MODEL))


def _gathers(a: Anatomy, expr: ast.AST) -> bool:
    """`all_gather(z)`, `accelerator.gather(z)`, or `everyone` after `dist.all_gather(everyone, z)`: every rank's
    rows, which pair completely."""
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return a.ref(expr) in _gathered_into(a)
    return isinstance(expr, ast.Call) and _is_gather(a, expr)


def _is_gather(a: Anatomy, call: ast.Call) -> bool:
    return (a.qualname(call.func) or method_name(call) or "").rpartition(".")[2] in _GATHERS


@per_anatomy
def _gathered_into(a: Anatomy) -> set:
    """The variables a gather fills in place: `everyone` in `dist.all_gather(everyone, z)`."""
    calls = [site.node for site in a.calls if isinstance(site.node, ast.Call) and _is_gather(a, site.node)]
    return {a.ref(call.args[0]) for call in calls if len(call.args) > 1} - {None}


def _from_batch(a: Anatomy, expr: ast.AST) -> bool:
    """Does `expr` hold this rank's rows of the batch: a training loader's, or a model's output for them?"""
    return any(_batch_source(a, node) for node in _upstream(a, expr))


def _batch_source(a: Anatomy, node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        return a.has_role(node.func, ROLE_MODEL)
    return isinstance(node, (ast.Name, ast.Attribute)) and a.has_role(node, ROLE_LOADER)


def _may_pair(node: ast.AST) -> bool:
    """A quick look: an operator, a call of a name that may pair rows or a call of two rows' views (`_sides` tells)."""
    if type(node) is ast.BinOp:
        return type(node.op) in _PAIRING_OPERATORS
    if type(node) is not ast.Call:
        return False
    func = node.func  # type: ignore[attr-defined]
    name = func.attr if type(func) is ast.Attribute else getattr(func, "id", None)
    return name in _PRODUCTS | _DISTANCES or len(node.args) >= 2 and type(node.args[0]) in _VIEWS  # type: ignore[attr-defined]


def _sides(a: Anatomy, node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """The two sides whose rows `node` pairs with each other, if it is shaped like such a pairing."""
    return _product_sides(a, node) or _broadcast_sides(node)


def _product_sides(a: Anatomy, node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """(a, b) of `a @ b.t()`, `torch.mm(a, b.T)`, `a.matmul(b.transpose(0, 1))` and `torch.cdist(a, b)`."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        operands = [node.left, node.right]
    else:
        name, operands = _operation(a, node)
        if len(operands) != 2 or name not in _PRODUCTS | _DISTANCES:
            return None
        if name in _DISTANCES:
            return operands[0], operands[1]
    transposed = _transposed(a, operands[1])
    return (operands[0], transposed) if transposed is not None else None


def _operation(a: Anatomy, node: ast.AST) -> tuple[str | None, list[ast.expr]]:
    """(`mm`, [x, y]) for `torch.mm(x, y)` and for `x.mm(y)`; (None, []) for anything else."""
    if not isinstance(node, ast.Call) or node.keywords:
        return None, []
    qualname = a.qualname(node.func) or ""
    if qualname.startswith(TORCH + "."):
        return qualname.rpartition(".")[2], node.args
    if isinstance(node.func, ast.Attribute):
        return node.func.attr, [node.func.value, *node.args]
    return None, []


def _transposed(a: Anatomy, expr: ast.expr) -> ast.expr | None:
    """`x` in `x.t()`, `x.T`, `x.transpose(0, 1)`, `x.permute(1, 0)`, `torch.t(x)`: rows made columns (not
    `transpose(-2, -1)`, which swaps a sample's tokens with its features)."""
    if isinstance(expr, ast.Attribute) and expr.attr == "T":
        return expr.value
    name, operands = _operation(a, expr)
    dims = operands[1:]
    swapped = [d.value for d in dims if constant(d, 0, 1)]  # type: ignore[attr-defined]
    swaps_rows = name == "t" and not dims or name in ("transpose", "permute") and len(dims) == 2 and sorted(swapped) == [0, 1]
    return operands[0] if swaps_rows and operands else None


def _broadcast_sides(node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """(x, y) of `x[:, None] - y[None]`, `x.unsqueeze(1) - y.unsqueeze(0)` and
    `F.cosine_similarity(x.unsqueeze(1), y.unsqueeze(0), dim=-1)`: each row against each row."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BROADCAST_OPERATORS):
        left, right = _new_dim(node.left), _new_dim(node.right)
    elif isinstance(node, ast.Call) and len(node.args) >= 2:
        left, right = _new_dim(node.args[0]), _new_dim(node.args[1])
    else:
        return None
    if left is None or right is None or {left[0], right[0]} != {_ROWS, _COLUMNS}:
        return None
    return left[1], right[1]


def _new_dim(expr: ast.expr) -> tuple[int, ast.expr] | None:
    """(0, x) for `x[None]`, `x[None, :]`, `x.unsqueeze(0)`; (1, x) for `x[:, None]`, `x.unsqueeze(1)`."""
    if isinstance(expr, ast.Call) and method_name(expr) == "unsqueeze" and len(expr.args) == 1 and not expr.keywords:
        dim = next((d for d in (_ROWS, _COLUMNS) if constant(expr.args[0], d)), None)
        return (dim, expr.func.value) if dim is not None else None  # type: ignore[attr-defined]
    if not isinstance(expr, ast.Subscript):
        return None
    index = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
    if len(index) > 2 or not index:
        return None
    if constant(index[0], None) and all(_whole(i) for i in index[1:]):
        return _ROWS, expr.value
    if len(index) == 2 and _whole(index[0]) and constant(index[1], None):
        return _COLUMNS, expr.value
    return None


def _whole(node: ast.expr) -> bool:
    return isinstance(node, ast.Slice) and node.lower is None and node.upper is None and node.step is None

