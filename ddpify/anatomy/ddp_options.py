"""What the DDP wrap's constructor options are chosen from (issue 26).

`gradient_as_bucket_view=True` makes each gradient a view into DDP's all-reduce buckets (no copy
after every backward, one gradient's memory less); it is safe unless the script rebinds a `.grad`
or changes one in place through a method (`p.grad.detach_()`). `broadcast_buffers=False` spares the
copy of rank 0's buffers before every forward; it is safe when the model has no BatchNorm
statistics and no other buffer that training changes (buffers registered as constants, like a
causal mask, are equal on every rank anyway), and it is chosen only where such constant buffers
exist: without buffers DDP copies nothing, and torch 2.13 warns that the option is deprecated
(`forward_sync_buffers`, which older torch lacks, replaces it). A model compiled where it is bound
(`model = torch.compile(model)`) is wrapped before the compile: the PyTorch docs' order, in which
the compiled graph breaks at DDP's buckets and their all-reduces overlap the backward.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy, ModelSite

BUFFER_REGISTRATION = "register_buffer"
BUILTIN_LAYERS = "torch.nn."
COMPILE = "torch.compile"


def compiled_where_bound(a: Anatomy, model: ModelSite) -> bool:
    """Is the statement that binds `model` its compile, `model = torch.compile(model, ...)`, with no move after it?"""
    stmt = model.stmt
    if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and len(stmt.targets) == 1):
        return False
    call = stmt.value
    compiled = a.qualname(call.func) == COMPILE and bool(call.args) and a.ref(call.args[0]) == a.ref(stmt.targets[0])
    return compiled and not model.placements


def writes_gradients(a: Anatomy) -> bool:
    """Does the script rebind a `.grad` (`p.grad = ...`, `p.grad += ...`, `del p.grad`) or call a method
    on one that changes it in place (`p.grad.detach_()`)?"""
    return any(
        isinstance(node, ast.Attribute) and node.attr == "grad" and (isinstance(node.ctx, (ast.Store, ast.Del)) or _changed_by_method(a, node))
        for node in a.nodes
    )


def buffers_need_no_broadcast(a: Anatomy, model: ModelSite) -> bool:
    """Is `model` built from this file's classes or torch.nn layers, with no BatchNorm, buffers registered
    by this file's model classes, and none of them written by a method other than `__init__`?"""
    known = model.class_name in a.model_classes or model.class_name.startswith(BUILTIN_LAYERS)
    registered = any(_registered_buffers(model_class.node) for model_class in a.model_classes.values())
    return known and model.has_batchnorm is False and not model.container and registered and not _training_changes_buffers(a)


def _training_changes_buffers(a: Anatomy) -> bool:
    """Does a method of a model class of this file, other than `__init__`, write a buffer it registers?"""
    for model_class in a.model_classes.values():
        buffers = _registered_buffers(model_class.node)
        for method in model_class.node.body:
            if isinstance(method, ast.FunctionDef) and method.name != "__init__" and _writes_any(a, method, buffers):
                return True
    return False


def _registered_buffers(cls: ast.ClassDef) -> set[str]:
    """The names of `self.register_buffer("name", ...)` anywhere in the class."""
    return {
        node.args[0].value for node in ast.walk(cls)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == BUFFER_REGISTRATION
        and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    }


def _writes_any(a: Anatomy, method: ast.FunctionDef, buffers: set[str]) -> bool:
    """Does `method` assign `self.<buffer>`, one of its items, or change it with an in-place method?"""
    for node in ast.walk(method):
        if isinstance(node, ast.Attribute) and node.attr in buffers and isinstance(node.value, ast.Name) and node.value.id == "self":
            parent = a.parents.get(node)
            item_stored = isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store)
            if isinstance(node.ctx, ast.Store) or item_stored or _changed_by_method(a, node):
                return True
    return False


def _changed_by_method(a: Anatomy, value: ast.Attribute) -> bool:
    """`value.add_(...)`: a call of an in-place method (its name ends in `_`) on `value`."""
    method = a.parents.get(value)
    return isinstance(method, ast.Attribute) and method.attr.endswith("_") and isinstance(a.parents.get(method), ast.Call)
