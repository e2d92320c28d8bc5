"""What runs inside each DataParallel replica, and what the training code does with its outputs.

`nn.DataParallel` copies the model onto every GPU for each call, splits the batch, runs `forward`
on each copy in its own thread and gathers the outputs on the first GPU. That makes a few things
that are harmless on one GPU go wrong, and the DP codemod and the DP lint rules both look for them:

* a device named inside `forward` (`x.to("cuda:0")`, `.cuda()`, `device=DEVICE`) pulls every
  replica's tensors onto one GPU;
* assignments to `self` inside `forward` land on a copy that is thrown away;
* a scalar loss returned by `forward` comes back as one loss per GPU and needs `.mean()`;
* the model's parameters must sit on `device_ids[0]`, and each GPU needs a part of every batch.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterator

from ddpify.anatomy.distributed.values import callers
from ddpify.anatomy.analyzer import ROLE_CRITERION, ROLE_MODEL, Anatomy, Function
from ddpify.anatomy.analyzer import walk_body  # every node of a body, not nested defs
from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.facts import ReplicaFacts, ScatterHazard
from ddpify.anatomy.sites import MODULE_SCOPE, ModelSite, Ref
from ddpify.anatomy.syntax import argument
from ddpify.anatomy.vocabulary import (
    DEVICE_MOVES,
    DP_WRAPPER,
    PAD_PACKED,
    RECURRENT_LAYERS,
    is_criterion_class,
    is_loss_function,
)

# Where the loss sits in what forward returns: () the value itself, (1,) a tuple item, ("loss",) a dict item.
LossPath = tuple[int | str, ...]

_CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
_DEVICE_QUALNAMES = frozenset({"torch.device", "torch.cuda.current_device"})
_LOSS_NAME = re.compile(r"(^|_)loss(es)?($|_)")
_REDUCTIONS = frozenset({"mean", "sum"})
_CONTAINER_MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "pop", "clear", "add", "remove"})
_MAX_DEPTH = 8
_RESHAPES = frozenset({"transpose", "permute", "t", "movedim", "swapaxes", "swapdims"})  # may put the batch first
_METADATA = frozenset({"shape", "size", "dim", "ndim", "device", "dtype"})  # read of a tensor that is not its data
_SELECTIONS = frozenset({"mean", "sum", "max", "min", "amax", "amin", "gather", "index_select"})  # may drop the time steps


# ----- the forward methods a wrapped model runs --------------------------------------------------
def forward_of(anatomy: Anatomy, class_name: str) -> ast.FunctionDef | None:
    """The `forward` a model class of this file runs (its own, or the nearest base class's)."""
    mc = anatomy.model_classes.get(class_name)
    if mc is None:
        return None
    if mc.forward is not None:
        return mc.forward
    bases = (anatomy.qualname(b) or "" for b in mc.node.bases)
    return next((f for f in (forward_of(anatomy, b) for b in bases) if f is not None), None)


def replica_forwards(anatomy: Anatomy, class_name: str) -> list[ast.FunctionDef]:
    """Every `forward` a replica of `class_name` runs: its own and its submodules' (this file's classes)."""
    found: list[ast.FunctionDef] = []
    pending, seen = [class_name], set()
    while pending:
        name = pending.pop()
        if name in seen or name not in anatomy.model_classes:
            continue
        seen.add(name)
        forward = forward_of(anatomy, name)
        if forward is not None and forward not in found:
            found.append(forward)
        pending.extend(_submodule_classes(anatomy, name))
    return found


def _submodule_classes(anatomy: Anatomy, class_name: str) -> list[str]:
    node = anatomy.model_classes[class_name].node
    names = (anatomy.qualname(c.func) for c in ast.walk(node) if isinstance(c, ast.Call))
    return [n for n in names if n in anatomy.model_classes]


def replica_forward_methods(anatomy: Anatomy, models: list[ModelSite]) -> list[ast.FunctionDef]:
    """Every `forward` that replicas of these models run, each once."""
    classes = dict.fromkeys(m.class_name for m in models if m.class_name in anatomy.model_classes)
    found: dict[ast.FunctionDef, None] = {}
    for cls in classes:
        found.update(dict.fromkeys(replica_forwards(anatomy, cls)))
    return list(found)


def function_of(anatomy: Anatomy, node: ast.FunctionDef) -> Function | None:
    """The analysis' record of a function or method definition (its scope name, locals, ...)."""
    return next((f for f in anatomy.functions.values() if f.node is node), None)


def dp_wrapped_models(anatomy: Anatomy) -> list[ModelSite]:
    """The models a script passes to `DataParallel(...)`, at the sites that construct them."""
    found: dict[ModelSite, None] = {}
    for wrap in anatomy.calls_to(DP_WRAPPER):
        if wrap.node.args:  # type: ignore[attr-defined]
            found.update(dict.fromkeys(anatomy.origins(wrap.node.args[0], ROLE_MODEL)))  # type: ignore[attr-defined, arg-type]
    return list(found)


def input_name(forward: ast.FunctionDef) -> str | None:
    """The first argument of `forward` after `self`: the input whose device a replica runs on."""
    params = [a.arg for a in (*forward.args.posonlyargs, *forward.args.args)][1:]
    return params[0] if params else None


def forward_scopes(anatomy: Anatomy, forward: ast.FunctionDef) -> list[ast.FunctionDef]:
    """`forward` and the methods of its class it calls through `self.method(...)`, transitively."""
    found, pending = [forward], [forward]
    while pending:
        for node in walk_body(pending.pop().body):
            callee = anatomy.callee(node) if isinstance(node, ast.Call) else None
            method = anatomy.functions[callee] if callee else None
            if method is not None and method.cls is not None and method.node not in found:
                found.append(method.node)  # type: ignore[arg-type]
                pending.append(method.node)  # type: ignore[arg-type]
    return found


# ----- devices named inside forward ----------------------------------------------------------
@dataclass(frozen=True)
class DeviceUse:
    """A hard-coded device inside forward.

    kind "device": `node` is a device argument (`"cuda:0"`, `DEVICE`, `torch.device(...)`);
    kind "cuda": `node` is a `t.cuda(...)` call; kind "redundant": `stmt` is `x = x.to(DEVICE)` on
    forward's own input, which already is on the replica's device.
    """

    node: ast.AST
    kind: str
    stmt: ast.stmt


def hardcoded_devices(anatomy: Anatomy, forward: ast.FunctionDef) -> list[DeviceUse]:
    """The devices `forward` names itself instead of following its input's device."""
    source = input_name(forward)
    found: list[DeviceUse] = []
    for node in walk_body(forward.body):
        if not isinstance(node, ast.Call):
            continue
        stmt = anatomy.stmt_of[node]
        if _is_redundant_move(anatomy, node, stmt, source, forward):
            found.append(DeviceUse(node, "redundant", stmt))
        elif _is_cuda_call(anatomy, node):
            found.append(DeviceUse(node, "cuda", stmt))
        else:
            found.extend(DeviceUse(arg, "device", stmt) for arg in _device_arguments(node) if is_fixed_device(anatomy, arg, forward))
    return found


def _device_arguments(call: ast.Call) -> list[ast.AST]:
    """`t.to(<device>)` and `device=<device>` of any call."""
    args = [kw.value for kw in call.keywords if kw.arg == "device"]
    if isinstance(call.func, ast.Attribute) and call.func.attr == "to" and call.args:
        args.append(call.args[0])
    return args


def _is_cuda_call(anatomy: Anatomy, call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "cuda" and anatomy.qualname(call.func) != "torch.cuda"


def _is_redundant_move(anatomy: Anatomy, call: ast.Call, stmt: ast.stmt, source: str | None, forward: ast.FunctionDef) -> bool:
    """`x = x.to(DEVICE)` / `x = x.cuda()` where x is forward's input, followed by more statements."""
    if source is None or not (isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1):
        return False
    target, func = stmt.targets[0], call.func
    if not (isinstance(target, ast.Name) and target.id == source and isinstance(func, ast.Attribute)):
        return False
    if not (isinstance(func.value, ast.Name) and func.value.id == source) or anatomy.block_of(stmt)[-1] is stmt:
        return False
    if any(kw.arg != "non_blocking" for kw in call.keywords):
        return False
    if func.attr == "cuda":
        return _is_cuda_call(anatomy, call) and len(call.args) <= 1
    return func.attr == "to" and len(call.args) == 1 and is_fixed_device(anatomy, call.args[0], forward)


def is_fixed_device(anatomy: Anatomy, expr: ast.AST, forward: ast.FunctionDef) -> bool:
    """Does `expr`, read inside `forward`, name one device for every replica?"""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str) and bool(_CUDA_STRING.match(expr.value))
    if isinstance(expr, ast.IfExp):
        return is_fixed_device(anatomy, expr.body, forward) or is_fixed_device(anatomy, expr.orelse, forward)
    if isinstance(expr, ast.Call):
        return anatomy.qualname(expr.func) in _DEVICE_QUALNAMES
    if isinstance(expr, ast.Name):
        values = _global_values(anatomy, expr.id) if expr.id not in _locals(anatomy, forward) else []
        return any(is_fixed_device(anatomy, v, forward) for v in values)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        return any(_is_device_value(anatomy, v, forward) for v in _self_attribute_values(anatomy, forward, expr.attr))
    return False


def _is_device_value(anatomy: Anatomy, value: ast.AST, forward: ast.FunctionDef) -> bool:
    """A value stored on the module as its device: a device expression, or an argument called `*device*`."""
    return is_fixed_device(anatomy, value, forward) or (isinstance(value, ast.Name) and "device" in value.id)


def _locals(anatomy: Anatomy, forward: ast.FunctionDef) -> set[str]:
    fn = function_of(anatomy, forward)
    return fn.locals if fn else set()


def _global_values(anatomy: Anatomy, name: str) -> list[ast.AST]:
    """Values assigned to module-level `name`."""
    return [s.value for s in anatomy.tree.body if isinstance(s, ast.Assign) and any(_binds(t, name) for t in s.targets)]


def _binds(target: ast.AST, name: str) -> bool:
    return isinstance(target, ast.Name) and target.id == name


def _self_attribute_values(anatomy: Anatomy, forward: ast.FunctionDef, attr: str) -> list[ast.AST]:
    """Values assigned to `self.<attr>` anywhere in the class that defines `forward`."""
    cls = next((mc.node for mc in anatomy.model_classes.values() if forward in mc.node.body), None)
    if cls is None:
        return []
    return [
        n.value
        for n in ast.walk(cls)
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Attribute) and t.attr == attr and _is_self(t.value) for t in n.targets)
    ]


def _is_self(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


# ----- state mutated inside forward ----------------------------------------------------------
def state_mutations(anatomy: Anatomy, forward: ast.FunctionDef) -> list[ast.AST]:
    """Statements and calls in `forward` (or the methods it calls) that change the module's Python state.

    Replicas are shallow copies made for one call: `self.x = ...` and `self.n += 1` are lost, and
    in-place changes to a shared list/dict race between the replicas' threads.
    """
    found: list[ast.AST] = []
    for scope in forward_scopes(anatomy, forward):
        for node in walk_body(scope.body):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(_on_self(t) for t in _targets(node)):
                found.append(node)
            elif isinstance(node, ast.Call) and _mutates_self_attribute(node):
                found.append(node)
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _targets(stmt: ast.Assign | ast.AugAssign | ast.AnnAssign) -> list[ast.AST]:
    return list(stmt.targets) if isinstance(stmt, ast.Assign) else [stmt.target]


def _on_self(target: ast.AST) -> bool:
    """`self.x`, `self.x[i]`, `self.x.y` (a tuple target counts when any item does)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_on_self(t) for t in target.elts)
    if not isinstance(target, (ast.Attribute, ast.Subscript)):
        return False
    while isinstance(target, (ast.Attribute, ast.Subscript)):
        target = target.value
    return _is_self(target)


def _mutates_self_attribute(call: ast.Call) -> bool:
    """`self.cache.append(x)`, `self.count.add_(1)`: a mutating method on something `self` holds."""
    func = call.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, (ast.Attribute, ast.Subscript)):
        return False
    in_place = func.attr in _CONTAINER_MUTATORS or (func.attr.endswith("_") and not func.attr.startswith("_"))
    return in_place and _on_self(func.value)


# ----- a loss returned from forward ------------------------------------------------------------
@dataclass(frozen=True)
class LossReturn:
    """Where forward returns a loss; `always` when every `return` of forward returns one."""

    forward: ast.FunctionDef
    paths: frozenset[LossPath]
    always: bool


@dataclass(frozen=True)
class LossAccess:
    """Where the training code takes a loss out of a model call's result.

    `node` is the expression that evaluates to the gathered per-GPU losses (the call, or
    `out["loss"]`), or, when `unpacked`, the name a tuple assignment `loss, logits = model(x)` binds.
    """

    node: ast.AST
    stmt: ast.stmt
    unpacked: bool = False


def loss_return(anatomy: Anatomy, forward: ast.FunctionDef) -> LossReturn | None:
    """Does `forward` return a loss, and where in its result?"""
    per_return = [_loss_paths(anatomy, r.value, forward) for r in _returns(forward) if r.value is not None]
    paths = frozenset(p for found in per_return for p in found)
    if not paths:
        return None
    return LossReturn(forward, paths, always=all(per_return))


def _returns(forward: ast.FunctionDef) -> Iterator[ast.Return]:
    return (n for n in walk_body(forward.body) if isinstance(n, ast.Return))


def _loss_paths(anatomy: Anatomy, value: ast.AST, forward: ast.FunctionDef) -> set[LossPath]:
    value = _local_value(value, forward)
    if isinstance(value, ast.Tuple):
        return {(i,) for i, item in enumerate(value.elts) if is_loss(anatomy, item, forward)}
    if isinstance(value, ast.Dict):
        return {
            (k.value,) for k, v in zip(value.keys, value.values)
            if isinstance(k, ast.Constant) and isinstance(k.value, str) and is_loss(anatomy, v, forward)
        }
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        return {(kw.arg,) for kw in value.keywords if kw.arg and is_loss(anatomy, kw.value, forward)}
    return {()} if is_loss(anatomy, value, forward) else set()


def _local_value(value: ast.AST, forward: ast.FunctionDef) -> ast.AST:
    """`out` in `out = {...}; return out` is the dict (or tuple) it was built as."""
    if not isinstance(value, ast.Name):
        return value
    built = _local_assignments(forward, value.id)
    is_container = len(built) == 1 and (isinstance(built[0], (ast.Tuple, ast.Dict)) or _is_dict_call(built[0]))
    return built[0] if is_container else value


def _is_dict_call(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "dict"


def is_loss(anatomy: Anatomy, expr: ast.AST, forward: ast.FunctionDef, _seen: frozenset[str] = frozenset()) -> bool:
    """Is `expr` (inside forward) a loss: a loss function or criterion call, a sum of losses, a `loss` variable?"""
    if isinstance(expr, ast.Name):
        if _LOSS_NAME.search(expr.id):
            return True
        seen = _seen | {expr.id}
        return expr.id not in _seen and any(is_loss(anatomy, v, forward, seen) for v in _local_assignments(forward, expr.id))
    if isinstance(expr, ast.BinOp):
        return is_loss(anatomy, expr.left, forward, _seen) or is_loss(anatomy, expr.right, forward, _seen)
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    if is_loss_function(anatomy.qualname(func) or "") or anatomy.has_role(func, ROLE_CRITERION):
        return True
    if isinstance(func, ast.Call):  # nn.MSELoss()(pred, y)
        return is_criterion_class(anatomy.qualname(func.func) or "")
    return isinstance(func, ast.Attribute) and func.attr in _REDUCTIONS and is_loss(anatomy, func.value, forward, _seen)


def _local_assignments(forward: ast.FunctionDef, name: str) -> list[ast.AST]:
    return [s.value for s in walk_body(forward.body) if isinstance(s, ast.Assign) and any(_binds(t, name) for t in s.targets)]


def model_calls(anatomy: Anatomy) -> Iterator[tuple[ast.Call, list[str]]]:
    """Calls of a model (`model(x)`, `self.model(x)`) outside the model classes, with the model's
    classes (those of this file and those another file defines)."""
    for site in anatomy.calls:
        call: ast.Call = site.node  # type: ignore[assignment]
        if site.scope.split(".")[0] in anatomy.model_classes:
            continue
        classes = {o.class_name for o in anatomy.origins(call.func, ROLE_MODEL) if isinstance(o, ModelSite)}
        if classes:
            yield call, sorted(classes)


def model_losses(anatomy: Anatomy) -> list[tuple[ast.Call, LossAccess]]:
    """Each place training code takes a loss out of a model call: where forward (a class of this
    file) returns one, and, whatever the model's class, where the call's whole result is
    back-propagated (`loss = model(x)` then `loss.backward()`: forward returned a scalar)."""
    found: dict[ast.AST, tuple[ast.Call, LossAccess]] = {}
    for call, classes in model_calls(anatomy):
        for cls in classes:
            returned = loss_return(anatomy, forward_of(anatomy, cls)) if cls in anatomy.model_classes else None
            for access in loss_accesses(anatomy, call, returned) if returned is not None else ():
                found.setdefault(access.node, (call, access))
        if _backpropagated(anatomy, call):
            found.setdefault(call, (call, LossAccess(call, anatomy.stmt_of[call])))
    return list(found.values())


def _backpropagated(anatomy: Anatomy, call: ast.Call) -> bool:
    """Is the call's whole result back-propagated: `model(x).backward()`, or `loss = model(x)` and
    then `loss.backward()` (after arithmetic too: `(loss / accumulation).backward()`)?"""
    parent = anatomy.parents.get(call)
    if isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        return any(_is_backward_of(anatomy, read) for read in reads_after(anatomy, parent, parent.targets[0]))
    return _is_backward_of(anatomy, call)


def _is_backward_of(anatomy: Anatomy, expr: ast.AST) -> bool:
    """`expr.backward()` with no gradient given, around arithmetic (`(expr / n).backward()`)."""
    parent = anatomy.parents.get(expr)
    while isinstance(parent, (ast.BinOp, ast.UnaryOp)):
        expr, parent = parent, anatomy.parents.get(parent)
    call = anatomy.parents.get(parent) if isinstance(parent, ast.Attribute) and parent.attr == "backward" else None
    return isinstance(call, ast.Call) and call.func is parent and not call.args and not call.keywords


def loss_accesses(anatomy: Anatomy, call: ast.Call, returned: LossReturn) -> list[LossAccess]:
    """Where the loss is taken out of this model call's result (empty when the call returns none)."""
    if not returned.always and not _passes_every_parameter(call, returned.forward):
        return []
    stmt = anatomy.stmt_of[call]
    if () in returned.paths:
        return [LossAccess(call, stmt)]
    parent = anatomy.parents.get(call)
    if isinstance(parent, ast.Subscript) and _key(parent) in returned.paths:
        return [LossAccess(parent, stmt)]
    if not (isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1):
        return []
    target = parent.targets[0]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [
            LossAccess(item, parent, unpacked=True)
            for i, item in enumerate(target.elts) if (i,) in returned.paths and isinstance(item, ast.Name)
        ]
    if isinstance(target, ast.Name):
        reads = (anatomy.parents.get(n) for n in reads_after(anatomy, parent, target))
        return [LossAccess(r, anatomy.stmt_of[r]) for r in reads if isinstance(r, ast.Subscript) and _key(r) in returned.paths]
    return []


def _key(subscript: ast.Subscript) -> LossPath | None:
    key = subscript.slice
    if isinstance(key, ast.Constant) and isinstance(key.value, (int, str)) and not isinstance(key.value, bool):
        return (key.value,)
    return None


def _passes_every_parameter(call: ast.Call, forward: ast.FunctionDef) -> bool:
    """Does the call fill every parameter of forward (so it takes the branch that returns the loss)?"""
    params = [a.arg for a in (*forward.args.posonlyargs, *forward.args.args)][1:]
    given = set(params[: len(call.args)]) | {kw.arg for kw in call.keywords}
    return set(params) <= given


def reads_after(anatomy: Anatomy, stmt: ast.stmt, name: ast.Name) -> list[ast.Name]:
    """Reads of the variable `stmt` binds to `name`, after `stmt` and until it is bound again
    (the right-hand side of that rebinding, as in `loss = loss.mean()`, still reads it)."""
    ref = anatomy.ref(name)
    scope = anatomy.scope_of.get(name, MODULE_SCOPE)
    body = anatomy.tree.body if scope == MODULE_SCOPE else anatomy.functions[scope].node.body
    later = sorted(
        (n for n in walk_body(body) if isinstance(n, ast.Name) and n.id == name.id and _after(n, stmt) and anatomy.ref(n) == ref),
        key=_start,
    )
    rebinding = min((anatomy.stmt_of[n] for n in later if isinstance(n.ctx, ast.Store)), key=_start, default=None)
    return [
        n for n in later
        if isinstance(n.ctx, ast.Load)
        and (rebinding is None or _start(n) < _start(rebinding) or anatomy.stmt_of[n] is rebinding)
    ]


def _start(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset  # type: ignore[attr-defined]


def _after(node: ast.AST, stmt: ast.stmt) -> bool:
    return _start(node) > (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)


def is_reduced(anatomy: Anatomy, expr: ast.AST) -> bool:
    """Is `expr` immediately reduced: `expr.mean()` / `expr.sum()`?"""
    parent = anatomy.parents.get(expr)
    return (
        isinstance(parent, ast.Attribute)
        and parent.value is expr
        and parent.attr in _REDUCTIONS
        and isinstance(anatomy.parents.get(parent), ast.Call)
    )


# ----- what DataParallel's scatter and gather break --------------------------------------------
def replica_facts(anatomy: Anatomy, class_name: str) -> ReplicaFacts:
    """What DataParallel must know of `class_name`, a model class of this file."""
    forward = forward_of(anatomy, class_name)
    hazards = (*_unscattered_arguments(anatomy, class_name, forward), *_ragged_outputs(anatomy, forward)) if forward else ()
    return ReplicaFacts(anatomy.path, hazards, _forward_aliases(anatomy.model_classes[class_name].node))


def model_replica_facts(anatomy: Anatomy, class_name: str) -> ReplicaFacts | None:
    """What DataParallel must know of a model class of this file or of another file of the project."""
    if class_name in anatomy.model_classes:
        return replica_facts(anatomy, class_name)
    exported = anatomy.facts.imported.get(class_name)
    return exported.replica if exported is not None else None


@dataclass(frozen=True)
class ScatterMisuse:
    """A call of a DataParallel-wrapped model that its scatter or gather breaks: `given` is the
    argument it would split along the wrong dimension (None: the output cannot be gathered)."""

    hazard: ScatterHazard
    facts: ReplicaFacts
    given: ast.AST | None = None


def scatter_misuses(anatomy: Anatomy, call: ast.Call, classes: list[str], wraps: Callable[[ast.Call], bool]) -> list[ScatterMisuse]:
    """What DataParallel's scatter or gather breaks in this call of a model of `classes`; `wraps`
    says which calls go through the wrapper. A state that only ever holds None or what such a call
    returned is fine: gathered along dim 0, it splits back into the parts each replica returned."""
    found = []
    for facts in filter(None, (model_replica_facts(anatomy, cls) for cls in classes)):
        for hazard in facts.hazards:
            given = argument(call, hazard.index, hazard.parameter) if hazard.parameter is not None else None
            if hazard.parameter is None or given is not None and not _round_trips(anatomy, given, wraps):
                found.append(ScatterMisuse(hazard, facts, given))
    return found


def _round_trips(anatomy: Anatomy, given: ast.AST, wraps: Callable[[ast.Call], bool]) -> bool:
    """Does `given` only ever hold None or what a call through the wrapper returned?"""
    ref = anatomy.ref(given) if isinstance(given, ast.Name) else None
    found = bindings(anatomy).get(ref, []) if ref is not None else []
    return bool(found) and all(
        isinstance(b.value, ast.Constant) and b.value.value is None
        or isinstance(b.stmt, ast.Assign) and isinstance(b.stmt.value, ast.Call) and wraps(b.stmt.value)
        for b in found
    )


def _unscattered_arguments(anatomy: Anatomy, class_name: str, forward: ast.FunctionDef) -> list[ScatterHazard]:
    """Forward's parameters that reach a recurrent layer with the batch in dim 1: its hidden state
    (always `(layers, batch, hidden)`) and, without `batch_first=True`, its input `(seq, batch, ...)`."""
    layers = _recurrent_layers(anatomy, class_name)
    params = _params(forward)
    found: dict[str, ScatterHazard] = {}
    for call in (n for n in walk_body(forward.body) if isinstance(n, ast.Call)):
        attr = call.func.attr if isinstance(call.func, ast.Attribute) and _is_self(call.func.value) else None
        if attr not in layers:
            continue
        hidden = call.args[1] if len(call.args) > 1 else next((kw.value for kw in call.keywords if kw.arg == "hx"), None)
        for param in _flowing_into(forward, hidden, params, _is_reshape) if hidden is not None else ():
            found.setdefault(param, ScatterHazard(call.lineno, f"`{param}` is the hidden state of self.{attr}, shaped (layers, batch, hidden)", param, params.index(param)))
        for param in _flowing_into(forward, call.args[0], params, _is_reshape) if call.args and not layers[attr] else ():
            found.setdefault(param, ScatterHazard(call.lineno, f"`{param}` reaches self.{attr}, which is not batch_first, shaped (seq, batch, ...)", param, params.index(param)))
    return list(found.values())


def _recurrent_layers(anatomy: Anatomy, class_name: str) -> dict[str, bool]:
    """The RNN/LSTM/GRU layers the class assigns to `self.<attr>`, with whether each is batch_first."""
    found = {}
    for node in ast.walk(anatomy.model_classes[class_name].node):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and anatomy.qualname(node.value.func) in RECURRENT_LAYERS:
            batch_first = next((kw.value for kw in node.value.keywords if kw.arg == "batch_first"), None)
            first = not isinstance(batch_first, ast.Constant) or bool(batch_first.value) if batch_first else False
            found.update({t.attr: first for t in node.targets if isinstance(t, ast.Attribute) and _is_self(t.value)})
    return found


def _ragged_outputs(anatomy: Anatomy, forward: ast.FunctionDef) -> list[ScatterHazard]:
    """`pad_packed_sequence` without `total_length=` whose padded steps forward returns: each
    replica pads to the longest sequence of its own part of the batch, and gather cannot join them."""
    padded = {n for n in walk_body(forward.body) if isinstance(n, ast.Call) and anatomy.qualname(n.func) == PAD_PACKED
              and not any(kw.arg == "total_length" for kw in n.keywords)}
    returned = [r.value for r in _returns(forward) if r.value is not None]
    return [
        ScatterHazard(call.lineno, "forward returns the padded output of pad_packed_sequence, as long as the longest sequence of each replica's part of the batch")
        for call in sorted(padded, key=_start) if any(_flowing_into(forward, value, {call}, _selects_steps) for value in returned)
    ]


def _flowing_into(forward: ast.FunctionDef, expr: ast.AST, sources, stop, seen: frozenset[str] = frozenset()) -> set:
    """Which of `sources` (forward's parameter names, or call nodes) reach `expr` through forward's
    local variables, not through what `stop` says keeps them out, nor as a shape or device
    (`torch.zeros(1, x.size(0), h)` holds none of `x`: _reads_metadata)."""
    found = set()
    pending = [expr]
    while pending:
        node = pending.pop()
        if stop(node) or _reads_metadata(node):
            continue
        if node in sources or isinstance(node, ast.Name) and node.id in sources:
            found.add(node if node in sources else node.id)  # type: ignore[attr-defined]
        elif isinstance(node, ast.Name) and node.id not in seen:
            for value in _assigned_values(forward, node.id):
                found |= _flowing_into(forward, value, sources, stop, seen | {node.id})
        pending.extend(ast.iter_child_nodes(node))
    return found


def _reads_metadata(node: ast.AST) -> bool:
    """`x.shape`, `x.size(0)`, `x.device`, `len(x)`: what a tensor is like, not what it holds."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return True
    return isinstance(node, ast.Attribute) and node.attr in _METADATA


def _assigned_values(forward: ast.FunctionDef, name: str) -> list[ast.AST]:
    """What forward assigns to `name`, whole or unpacked (`out, h = self.rnn(x)` assigns the call)."""
    return [
        s.value for s in walk_body(forward.body)
        if isinstance(s, ast.Assign) and any(isinstance(n, ast.Name) and n.id == name for t in s.targets for n in ast.walk(t))
    ]


def _is_reshape(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _RESHAPES


def _selects_steps(node: ast.AST) -> bool:
    """Indexing or a reduction: what may leave the padded time steps behind (`out[:, -1]`,
    `out.mean(1)`); not the item of the pair pad_packed_sequence returns (`pad_packed_sequence(...)[0]`)."""
    if isinstance(node, ast.Subscript):
        return not (isinstance(node.value, ast.Call) and isinstance(node.slice, ast.Constant))
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SELECTIONS


def _params(fn: ast.FunctionDef) -> list[str]:
    """A method's positional parameters after self."""
    return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)][1:]


def _forward_aliases(cls: ast.ClassDef) -> frozenset[str]:
    """The class's methods whose whole body is `return self(<its parameters>)` (or `self.forward(...)`)."""
    return frozenset(m.name for m in cls.body if isinstance(m, ast.FunctionDef) and m.name != "forward" and _only_calls_forward(m))


def _only_calls_forward(method: ast.FunctionDef) -> bool:
    body = [s for s in method.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
    if not isinstance(call, ast.Call) or call.keywords or method.args.vararg or method.args.kwonlyargs:
        return False
    func = call.func
    on_self = _is_self(func) or isinstance(func, ast.Attribute) and func.attr == "forward" and _is_self(func.value)
    return on_self and [a.id if isinstance(a, ast.Name) else None for a in call.args] == _params(method)


def training_method_call(anatomy: Anatomy, attr: ast.Attribute) -> ast.Call | None:
    """`model.<method>(...)` when `attr` is its function and the training step back-propagates its
    result: DataParallel parallelises forward alone, so it must not go through `.module`."""
    call = anatomy.parents.get(attr)
    return call if isinstance(call, ast.Call) and call.func is attr and feeds_backward(anatomy, call) else None


def forward_aliases_of(anatomy: Anatomy, model: ast.AST) -> frozenset[str]:
    """The methods of `model`'s classes (this file's or another's) that only call forward."""
    classes = {site.class_name for site in anatomy.origins(model, ROLE_MODEL) if isinstance(site, ModelSite)}
    facts = [model_replica_facts(anatomy, cls) for cls in classes]
    return frozenset().union(*(f.forward_aliases for f in facts if f is not None))


def feeds_backward(anatomy: Anatomy, call: ast.Call) -> bool:
    """Is `call`'s result back-propagated, through the variables assigned from it after it
    (`loss = criterion(model.predict(x), y)` ... `loss.backward()`), other than as an input of a
    model (a hidden state that `model.init_hidden()` makes is not where the loss comes from)?"""
    scope = anatomy.scope_of.get(call, MODULE_SCOPE)
    body = anatomy.tree.body if scope == MODULE_SCOPE else anatomy.functions[scope].node.body
    start = _start(anatomy.stmt_of[call])
    held: set[str] = set()

    def holds(expr: ast.AST) -> bool:
        pending = [expr]
        while pending:
            node = pending.pop()
            if node is call or isinstance(node, ast.Name) and node.id in held:
                return True
            if not (isinstance(node, ast.Call) and anatomy.has_role(node.func, ROLE_MODEL)):
                pending.extend(ast.iter_child_nodes(node))
        return False

    later = sorted((n for n in walk_body(body) if isinstance(n, (ast.Assign, ast.AugAssign, ast.Call)) and _start(n) >= start), key=_start)
    for node in later:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward" and holds(node.func.value):
            return True
        if isinstance(node, (ast.Assign, ast.AugAssign)) and holds(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            held |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return False


# ----- constants the script spells out --------------------------------------------------------
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
    if isinstance(value, str) and _CUDA_STRING.match(value):
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
