"""The copies of a loader's batches onto the model's GPU, which can be made without waiting for the GPU.

`x.to(device)` from ordinary (pageable) host memory is a blocking copy: it first waits for every kernel
already queued on the GPU, so the host stops getting ahead of the GPU at each step. With
`non_blocking=True` the copy is queued on the same stream (every later kernel still sees the data) and the
host goes on; an expert port writes it (with the loader's memory pinned, the copy itself is asynchronous
too). On a CPU-only machine it changes nothing.

`batch_copies` finds the copies that are safe to make so: in a step loop over a torch DataLoader with the
default collate, a `.to(D)` or `.cuda()` of a name the loop unpacks from a tuple batch (`for x, y in
loader`, `for i, (x, y) in enumerate(loader)`: tensors, whose `.to` takes `non_blocking`; a whole batch
may be an object of the script's own whose `.to` does not), where D is the device the script moves a
model to (so the copy goes host to GPU, never GPU to host, where a non-blocking copy could be read before
it lands), and no `non_blocking` or other option is given.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.literals import model_moves
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import LoopSite
from ddpify.anatomy.tree import walk_body

_DATA_LOADER = "torch.utils.data.DataLoader"
_OWN_BATCHES = ("collate_fn", "batch_sampler")  # options that may make a batch something other than tensors


@per_anatomy
def batch_copies(a: Anatomy) -> tuple[ast.Call, ...]:
    """The `.to(device)` / `.cuda()` copies of tensor batches onto the model's device that may not block."""
    devices = _model_devices(a)
    return tuple(
        node for loop in a.step_loops if _default_tensor_batches(a, loop)
        for node in walk_body(loop.node.body)
        if isinstance(node, ast.Call) and _copies_unpacked_batch(node, _unpacked_names(loop.node.target), devices)
    )


def _model_devices(a: Anatomy) -> set[str]:
    """The device expressions (as written) that the trained models are moved to with `.to(...)`."""
    return {ast.unparse(move.args[0]) for model in a.trained_models for move in model_moves(model)
            if move.func.attr == "to" and len(move.args) == 1 and not move.keywords  # type: ignore[attr-defined]
            and not (isinstance(move.args[0], ast.Constant) and move.args[0].value == "cpu")}


def _default_tensor_batches(a: Anatomy, loop: LoopSite) -> bool:
    """Every loader the loop walks is a torch DataLoader built here, with the default collate."""
    return bool(loop.loaders) and all(
        loader.call is not None and not loader.built_elsewhere and a.qualname(loader.call.func) == _DATA_LOADER
        and not any(kw.arg in _OWN_BATCHES or kw.arg is None for kw in loader.call.keywords)
        for loader in loop.loaders)


def _unpacked_names(target: ast.expr) -> set[str]:
    """The names a loop target unpacks from tuples (`x, y` or `i, (x, y)`), not a whole batch (`batch`)."""
    if not isinstance(target, (ast.Tuple, ast.List)):
        return set()
    names = set()
    for element in target.elts:
        if isinstance(element, ast.Name):
            names.add(element.id)
        else:
            names |= _unpacked_names(element)
    return names


def _copies_unpacked_batch(call: ast.Call, names: set[str], devices: set[str]) -> bool:
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in names) or call.keywords:
        return False
    if func.attr == "cuda":
        return not call.args
    return func.attr == "to" and len(call.args) == 1 and ast.unparse(call.args[0]) in devices
