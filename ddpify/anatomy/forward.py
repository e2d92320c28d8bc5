"""What runs inside each DataParallel replica: the forward methods a wrapped model runs, the devices
named inside them and the state they mutate.

`nn.DataParallel` copies the model onto every GPU for each call, splits the batch, runs `forward`
on each copy in its own thread and gathers the outputs on the first GPU. That makes a few things
that are harmless on one GPU go wrong, and the DP codemod and the DP lint rules both look for them:

* a device named inside `forward` (`x.to("cuda:0")`, `.cuda()`, `device=DEVICE`) pulls every
  replica's tensors onto one GPU (here);
* assignments to `self` inside `forward` land on a copy that is thrown away (here);
* a scalar loss returned by `forward` comes back as one loss per GPU and needs `.mean()`
  (`forward_losses`); arguments and outputs that scatter and gather split wrongly (`scatter_gather`);
* the model's parameters must sit on `device_ids[0]` (`literals` reads the GPU it is moved to).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import ModelSite
from ddpify.anatomy.tree import Function, walk_body
from ddpify.anatomy.values import ROLE_MODEL
from ddpify.anatomy.vocabulary import DP_WRAPPER

CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
_DEVICE_QUALNAMES = frozenset({"torch.device", "torch.cuda.current_device"})
_CONTAINER_MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "pop", "clear", "add", "remove"})


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
        return isinstance(expr.value, str) and bool(CUDA_STRING.match(expr.value))
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
    return [s.value for s in anatomy.tree.body if isinstance(s, ast.Assign) and any(binds(t, name) for t in s.targets)]


def binds(target: ast.AST, name: str) -> bool:
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
        and any(isinstance(t, ast.Attribute) and t.attr == attr and is_self(t.value) for t in n.targets)
    ]


def is_self(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


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
    return is_self(target)


def _mutates_self_attribute(call: ast.Call) -> bool:
    """`self.cache.append(x)`, `self.count.add_(1)`: a mutating method on something `self` holds."""
    func = call.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, (ast.Attribute, ast.Subscript)):
        return False
    in_place = func.attr in _CONTAINER_MUTATORS or (func.attr.endswith("_") and not func.attr.startswith("_"))
    return in_place and _on_self(func.value)
