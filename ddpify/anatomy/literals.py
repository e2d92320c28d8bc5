"""Constants the script spells out: the literal a value comes from (a batch size), the GPU index a
device names (`"cuda:1"`, `torch.device("cuda", 1)`), and the GPU a model is moved to.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.distributed.reaching import callers
from ddpify.anatomy.forward import CUDA_STRING
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import ModelSite, Ref
from ddpify.anatomy.syntax import argument
from ddpify.anatomy.vocabulary import DEVICE_MOVES

_MAX_DEPTH = 8


def literal(anatomy: Anatomy, expr: ast.AST, depth: int = 0) -> ast.Constant | None:
    """The literal `expr` evaluates to, where the script writes it: names are followed to their
    assignments, parameters to what the callers pass (or the default); None unless all agree."""
    if isinstance(expr, ast.Constant):
        return expr
    ref = anatomy.ref(expr) if isinstance(expr, ast.Name) and depth <= _MAX_DEPTH else None
    if ref is None:
        return None
    found = [literal(anatomy, v, depth + 1) if v is not None else None for v in _values_of(anatomy, ref)]
    if not found or any(c is None for c in found) or len({c.value for c in found}) > 1:  # type: ignore[union-attr]
        return None
    return found[0]


def _values_of(anatomy: Anatomy, ref: Ref) -> list[ast.AST | None]:
    """What is assigned to `ref`, or passed for it when it is a parameter (None: not a plain value)."""
    values: list[ast.AST | None] = [b.value if b.whole else None for b in bindings(anatomy).get(ref, ())]
    fn = anatomy.functions.get(ref.scope)
    if fn is not None and ref.name in fn.params:
        index = fn.params.index(ref.name)
        passed = [argument(call, index, ref.name) for call in callers(anatomy, ref.scope)]
        values += [v if v is not None else _default(fn.node, ref.name) for v in passed] or [None]
    return values


def _default(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> ast.AST | None:
    positional = [*fn.args.posonlyargs, *fn.args.args]
    names = [a.arg for a in positional][len(positional) - len(fn.args.defaults):]
    return dict(zip(names, fn.args.defaults)).get(name)


def gpu_index(anatomy: Anatomy, expr: ast.AST, depth: int = 0) -> int | None:
    """The GPU `expr` names: `"cuda:1"` -> 1, `"cuda"` -> 0, `torch.device("cuda", 1)` -> 1, `1` -> 1,
    through variables and `"cuda:1" if torch.cuda.is_available() else "cpu"`; None for CPU or unknown."""
    if depth > _MAX_DEPTH:
        return None
    if isinstance(expr, ast.IfExp):
        return gpu_index(anatomy, expr.body, depth + 1)
    if isinstance(expr, ast.Call) and anatomy.qualname(expr.func) == "torch.device" and expr.args:
        if len(expr.args) == 2 and gpu_index(anatomy, expr.args[0], depth + 1) is not None:
            return gpu_index(anatomy, expr.args[1], depth + 1)
        return gpu_index(anatomy, expr.args[0], depth + 1)
    ref = anatomy.ref(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
    if ref is not None:
        indices = {gpu_index(anatomy, v, depth + 1) if v is not None else None for v in _values_of(anatomy, ref)}
        return indices.pop() if len(indices) == 1 else None
    value = expr.value if isinstance(expr, ast.Constant) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and CUDA_STRING.match(value):
        return int(value.partition(":")[2] or 0)
    return None


def model_moves(model: ModelSite) -> list[ast.Call]:
    """The `.to(...)` / `.cuda(...)` calls that put `model` on its device, in source order."""
    return [
        n for stmt in (model.stmt, *model.placements) for n in ast.walk(stmt)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in DEVICE_MOVES
    ]


def model_gpu_index(anatomy: Anatomy, model: ModelSite) -> int | None:
    """The GPU the script moves `model` to (`.to(dev)`, `.cuda(k)`), when it names one."""
    return gpu_of_moves(anatomy, model_moves(model))


def gpu_of_moves(anatomy: Anatomy, moves: list[ast.Call]) -> int | None:
    """The GPU the last of these `.to(...)` / `.cuda(...)` calls that names one puts the model on."""
    for move in reversed(moves):
        target = move.args[0] if move.args else next((kw.value for kw in move.keywords if kw.arg == "device"), None)
        if target is None:
            return 0 if move.func.attr == "cuda" else None  # type: ignore[attr-defined]
        index = gpu_index(anatomy, target)
        if index is not None:
            return index
    return None
