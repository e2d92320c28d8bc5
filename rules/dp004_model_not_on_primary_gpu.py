"""DP004: the model's parameters are not on `device_ids[0]`, DataParallel's primary GPU."""

from __future__ import annotations

import ast

from ddpify.anatomy import DP_WRAPPER, MODULE_SCOPE, Anatomy
from ddpify.anatomy.distributed.reaching import reaching_values
from ddpify.anatomy import syntax
from ddpify.anatomy.literals import gpu_index, gpu_of_moves
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.vocabulary import DEVICE_MOVES
from ddpify.lint import Finding, Invalid, Rule



class ModelNotOnPrimaryGpu(Rule, code="DP004", name="model-not-on-primary-gpu", severity="error"):
    """## What it does
    Flags `nn.DataParallel(model, device_ids=...)` when the script put `model` on another GPU than
    `device_ids[0]`: `model.to("cuda:1")` with the default `device_ids` (every GPU, cuda:0 first),
    or `device_ids=[1, 2]` for a model on cuda:0. Devices are followed through variables
    (`device = torch.device("cuda:1")` ... `model.to(device)`).

    ## Why is this bad?
    DataParallel keeps the original parameters on `device_ids[0]` and copies them from there to the
    other GPUs on every call. If they are elsewhere the first forward fails with "module must have
    its parameters and buffers on device cuda:0 (device_ids[0]) but found one of them on device:
    cuda:1".

    ## Example
    ```python
    model = Net().to("cuda:1")
    model = nn.DataParallel(model, device_ids=[0, 1])
    ```

    ## Use instead
    ```python
    model = Net().to("cuda:1")
    model = nn.DataParallel(model, device_ids=[1, 0])
    ```

    ## Fix safety
    No fix: whether the model or the device list is wrong depends on which GPUs the user means to use.
    """

    message = "the model is not on device_ids[0], where DataParallel needs its parameters"

    def check(self, a):
        for wrap in a.calls_to(DP_WRAPPER):
            call: ast.Call = wrap.node  # type: ignore[assignment]
            module = syntax.argument(call, 0, "module")
            placed = gpu_of_moves(a, _moves_of(a, module, call)) if module is not None else None
            ids = syntax.argument(call, 1, "device_ids")
            primary = _primary_gpu(a, ids)
            if placed is None or primary is None or placed == primary:
                continue
            where = "device_ids[0]" if ids is not None else "device_ids[0] (by default, cuda:0)"
            message = f"the model is on cuda:{placed} but DataParallel needs it on {where}: list cuda:{placed} first in device_ids, or move the model to cuda:{primary}"
            yield Finding(a.pos(ids if ids is not None else call), message)


def _moves_of(a: Anatomy, module: ast.AST, wrap: ast.Call) -> list[ast.Call]:
    """`.to()` / `.cuda()` calls that placed `module` before the wrap, in source order."""
    values = [module]
    if isinstance(module, (ast.Name, ast.Attribute)):
        values += reaching_values(a, module)
        ref, scope = a.ref(module), a.scope_of.get(wrap, MODULE_SCOPE)
        body = a.tree.body if scope not in a.functions else a.functions[scope].node.body
        values += [n for n in walk_body(body) if _is_move(n) and n.lineno < wrap.lineno and a.ref(n.func.value) == ref]  # type: ignore[attr-defined]
    moves = {n for v in values for n in ast.walk(v) if _is_move(n)}
    return sorted(moves, key=lambda n: (n.lineno, n.col_offset))


def _is_move(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DEVICE_MOVES


def _primary_gpu(a: Anatomy, ids: ast.AST | None) -> int | None:
    """device_ids[0]: 0 by default; None when the script's list can't be read."""
    if ids is None or syntax.constant(ids, None):
        return 0
    if isinstance(ids, ast.Name):
        values = reaching_values(a, ids)
        ids = values[0] if len(values) == 1 else None
    if isinstance(ids, (ast.List, ast.Tuple)) and ids.elts:
        return gpu_index(a, ids.elts[0])
    return None


def _wrapping(placement: str, arguments: str) -> str:
    """A script that puts `net` on a device with the `placement` statements, then wraps it:
    `model = nn.DataParallel(<arguments>)` on its last line."""
    return f"import torch\nfrom torch import nn\n\nnet = nn.Linear(4, 2)\n{placement}model = nn.DataParallel({arguments})\n"


def _misplaced(placement: str, arguments: str) -> Invalid:
    """A case reported at the DataParallel call, the last line."""
    script = _wrapping(placement, arguments)
    return Invalid(script, line=script.count("\n"))


ModelNotOnPrimaryGpu.VALID = (
    _wrapping("", "net.cuda()"),
    _wrapping("net.to('cuda:1')\n", "net, device_ids=[1, 0]"),
    _wrapping("device = torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')\n", "net.to(device)"),
    # where the model is can't be read: no finding
    _wrapping("import sys\n", "net.to(sys.argv[1]), device_ids=[2, 3]"),
)
ModelNotOnPrimaryGpu.INVALID = (
    _misplaced("model = net.to('cuda:1')\n", "model"),
    _misplaced("GPUS = [1, 2]\nnet.cuda()\n", "net, device_ids=GPUS"),
    _misplaced("device = torch.device('cuda', 1)\n", "net.to(device), device_ids=[0, 1]"),
)
