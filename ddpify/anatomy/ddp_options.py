"""What the DDP wrap's constructor options are chosen from (issue 26).

`gradient_as_bucket_view=True` makes each gradient a view into DDP's all-reduce buckets (no copy
after every backward, one gradient's memory less); it is safe unless the script rebinds a `.grad`
or changes one in place through a method (`p.grad.detach_()`), or two wrapped models hold the same
parameters (`E1 = Encoder(shared)`, `E2 = Encoder(shared)`, as in UNIT-style GANs): each wrapper
points the shared `.grad` at its own bucket, and the other's backward fails ("parameter gradient
is not the expected DDP bucket view"). `broadcast_buffers=False` spares the
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
import builtins

from ddpify.anatomy import Anatomy, ModelSite, Ref
from ddpify.anatomy.bindings import bindings

BUFFER_REGISTRATION = "register_buffer"
BUILTIN_LAYERS = "torch.nn."
COMPILE = "torch.compile"


def compiled_where_bound(a: Anatomy, model: ModelSite) -> bool:
    """Is the statement that binds `model` its compile, `model = torch.compile(model, ...)`, with no move or cast after it?"""
    stmt = model.stmt
    if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and len(stmt.targets) == 1):
        return False
    call = stmt.value
    compiled = a.qualname(call.func) == COMPILE and bool(call.args) and a.ref(call.args[0]) == a.ref(stmt.targets[0])
    return compiled and model.ready_at is stmt


def writes_gradients(a: Anatomy) -> bool:
    """Does the script rebind a `.grad` (`p.grad = ...`, `p.grad += ...`, `del p.grad`) or call a method
    on one that changes it in place (`p.grad.detach_()`)?"""
    return any(
        node.attr == "grad" and (isinstance(node.ctx, (ast.Store, ast.Del)) or _changed_by_method(a, node))
        for node in a.nodes_of(ast.Attribute)
    )


def shares_parameters(a: Anatomy, model: ModelSite) -> bool:
    """Does `model` hold parameters another trained model holds too: a module handed to both their
    constructors (`Encoder(shared)` twice), or one of them handed to the other's (`Full(encoder)`)?"""
    trained = {m.target for m in a.trained_models}
    held = _constructor_modules(a, model, trained) | {model.target}
    return any(
        held & (_constructor_modules(a, other, trained) | {other.target}) for other in a.trained_models if other.target != model.target
    )


def _constructor_modules(a: Anatomy, model: ModelSite, trained: set[Ref]) -> set[Ref]:
    """The variables handed to the constructors that bind `model`'s variable and that hold a trained model or
    may hold a module."""
    calls = [
        node for binding in bindings(a).get(model.target, []) if binding.assigned
        for node in ast.walk(binding.value) if isinstance(node, ast.Call) and _constructs(a, node)
    ]
    handed = [a.ref(arg) for call in calls for arg in [*call.args, *(keyword.value for keyword in call.keywords)]]
    return {ref for ref in handed if ref is not None and (ref in trained or _may_hold_a_module(a, ref))}


def _may_hold_a_module(a: Anatomy, ref: Ref) -> bool:
    """Is `ref` bound to a constructor's result (`nn.Linear(...)`, `Block(...).to(device)`) that is not a known
    non-module (`torch.device(...)`, `int(...)`, a tuple)?"""
    built = [_first_of_chain(binding.value) for binding in bindings(a).get(ref, []) if binding.assigned]
    return any(isinstance(call, ast.Call) and _constructs(a, call) and not _builds_no_module(a, call) for call in built)


def _first_of_chain(value: ast.AST) -> ast.AST:
    """`Block(...)` in `Block(...).to(device).eval()`: the call a chain of method calls starts from."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and isinstance(value.func.value, ast.Call):
        value = value.func.value
    return value


def _constructs(a: Anatomy, call: ast.Call) -> bool:
    """`Block(...)`, `nn.Linear(...)`: a call of a name or of an import's attribute, not a method of a
    variable (`model.cuda()`) or of a result (`Block().to(device)`)."""
    return isinstance(call.func, ast.Name) or _imported(a, call)


def _builds_no_module(a: Anatomy, call: ast.Call) -> bool:
    """A call of a builtin (`int(...)`) or of an imported callable that builds no model (`torch.device(...)`,
    `yaml.safe_load(...)`)."""
    builtin = isinstance(call.func, ast.Name) and hasattr(builtins, call.func.id) and call.func.id not in a.names.aliases
    return builtin or _imported(a, call) and not a.is_model_constructor(a.qualname(call.func) or "")


def _imported(a: Anatomy, call: ast.Call) -> bool:
    """Is the callee a name an import binds, or an attribute of one (`nn.Linear`)?"""
    head = call.func
    while isinstance(head, ast.Attribute):
        head = head.value
    return isinstance(head, ast.Name) and head.id in a.names.aliases


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
