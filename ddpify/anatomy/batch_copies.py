"""The copies of a loader's batches onto the model's GPU, which can be made without waiting for the GPU.

`x.to(device)` from ordinary (pageable) host memory is a blocking copy: it first waits for every kernel
already queued on the GPU, so the host stops getting ahead of the GPU at each step. With
`non_blocking=True` the copy is queued on the same stream (every later kernel still sees the data) and the
host goes on; an expert port writes it (with the loader's memory pinned, the copy itself is asynchronous
too). On a CPU-only machine it changes nothing.

`batch_copies` finds the copies that are safe to make so: in a step loop over a torch DataLoader with the
default collate, a `.to(D)` or `.cuda()` of a name the loop unpacks from a tuple batch (`for x, y in
loader`, `for i, (x, y) in enumerate(loader)`) or of a batch's element (`data[0]`): tensors, whose `.to`
takes `non_blocking` (the default collate makes tensors, or tuples, lists and mappings of them; a whole
batch may be a mapping type of a library's own, whose `.to` may not take it: a tokenizer's BatchEncoding,
so no copy changes in a script that imports transformers). D must be the device the script moves a
trained model to (so the copy goes host to GPU, never GPU to host, where a non-blocking copy could be
read before it lands), and no `non_blocking` or other option given.
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
_OWN_BATCH_TYPES = ("transformers",)  # libraries whose batches are mappings with a `.to` of their own


@per_anatomy
def batch_copies(a: Anatomy) -> tuple[ast.Call, ...]:
    """The `.to(device)` / `.cuda()` copies of tensor batches onto the model's device that may not block."""
    if any(a.names.imports(library) for library in _OWN_BATCH_TYPES):
        return ()
    devices = _model_devices(a)
    return tuple(
        node for loop in a.step_loops if _default_tensor_batches(a, loop)
        for node in walk_body(loop.node.body)
        if isinstance(node, ast.Call) and _copies_batch_tensor(node, _target_names(loop.node.target), devices)
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


def _target_names(target: ast.expr) -> tuple[set[str], set[str]]:
    """The names a loop target unpacks from tuples (`x, y` or `i, (x, y)`), and those it binds whole."""
    if isinstance(target, ast.Name):
        return set(), {target.id}
    unpacked, whole = set(), set()
    for element in target.elts if isinstance(target, (ast.Tuple, ast.List)) else ():
        if isinstance(element, ast.Name):
            unpacked.add(element.id)
            whole.add(element.id)  # `for i, data in enumerate(loader)`: data is a whole batch
        else:
            inner = _target_names(element)
            unpacked, whole = unpacked | inner[0], whole | inner[1]
    return unpacked, whole


def _copies_batch_tensor(call: ast.Call, names: tuple[set[str], set[str]], devices: set[str]) -> bool:
    """`x.to(D)` / `x.cuda()` of an unpacked name, or `data[k].to(D)` of an element of a batch."""
    func = call.func
    if not isinstance(func, ast.Attribute) or call.keywords or not _batch_tensor(func.value, *names):
        return False
    if func.attr == "cuda":
        return not call.args
    return func.attr == "to" and len(call.args) == 1 and ast.unparse(call.args[0]) in devices


def _batch_tensor(receiver: ast.expr, unpacked: set[str], whole: set[str]) -> bool:
    if isinstance(receiver, ast.Name):
        return receiver.id in unpacked
    return (isinstance(receiver, ast.Subscript) and isinstance(receiver.value, ast.Name) and receiver.value.id in whole
            and isinstance(receiver.slice, ast.Constant) and type(receiver.slice.value) is int)
