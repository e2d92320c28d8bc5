"""What DataParallel's scatter and gather break: arguments forward receives unsplit (a hidden state,
a length list), outputs whose batch dimension is not first or whose sizes differ per GPU, and the
model's methods that only call forward (`ReplicaFacts`, read by this file and by other files).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable

from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.facts import ReplicaFacts, ScatterHazard
from ddpify.anatomy.forward import forward_of, is_self
from ddpify.anatomy.forward_losses import return_statements, source_position
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, ModelSite
from ddpify.anatomy.syntax import argument
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.values import ROLE_MODEL
from ddpify.anatomy.vocabulary import PAD_PACKED, RECURRENT_LAYERS

_RESHAPES = frozenset({"transpose", "permute", "t", "movedim", "swapaxes", "swapdims"})  # may put the batch first
_METADATA = frozenset({"shape", "size", "dim", "ndim", "device", "dtype"})  # read of a tensor that is not its data
_SELECTIONS = frozenset({"mean", "sum", "max", "min", "amax", "amin", "gather", "index_select"})  # may drop the time steps


def replica_facts(anatomy: Anatomy, class_name: str) -> ReplicaFacts:
    """What DataParallel must know of `class_name`, a model class of this file."""
    forward = forward_of(anatomy, class_name)
    hazards = (*_unscattered_arguments(anatomy, class_name, forward), *_ragged_outputs(anatomy, forward)) if forward else ()
    cls = anatomy.model_classes[class_name].node
    return ReplicaFacts(anatomy.path, hazards, _forward_aliases(cls), frozenset(m.name for m in cls.body if isinstance(m, ast.FunctionDef)))


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


def misuse_text(call: ast.Call, misuse: ScatterMisuse) -> str:
    """What goes wrong, for the user (the codemod's missing item, the lint's finding)."""
    where = f"{misuse.facts.path}:{misuse.hazard.line}"
    if misuse.given is None:
        return f"DataParallel cannot gather what `{ast.unparse(call.func)}(...)` returns: {misuse.hazard.why} ({where})"
    return f"DataParallel would split `{ast.unparse(misuse.given)}` along dim 0, not along its batch: {misuse.hazard.why} ({where})"


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
        attr = call.func.attr if isinstance(call.func, ast.Attribute) and is_self(call.func.value) else None
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
            found.update({t.attr: first for t in node.targets if isinstance(t, ast.Attribute) and is_self(t.value)})
    return found


def _ragged_outputs(anatomy: Anatomy, forward: ast.FunctionDef) -> list[ScatterHazard]:
    """`pad_packed_sequence` without `total_length=` whose padded steps forward returns: each
    replica pads to the longest sequence of its own part of the batch, and gather cannot join them."""
    padded = {n for n in walk_body(forward.body) if isinstance(n, ast.Call) and anatomy.qualname(n.func) == PAD_PACKED
              and not any(kw.arg == "total_length" for kw in n.keywords)}
    returned = [r.value for r in return_statements(forward) if r.value is not None]
    return [
        ScatterHazard(call.lineno, "forward returns the padded output of pad_packed_sequence, as long as the longest sequence of each replica's part of the batch")
        for call in sorted(padded, key=source_position) if any(_flowing_into(forward, value, {call}, _selects_steps) for value in returned)
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
    on_self = is_self(func) or isinstance(func, ast.Attribute) and func.attr == "forward" and is_self(func.value)
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
    start = source_position(anatomy.stmt_of[call])
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

    later = sorted((n for n in walk_body(body) if isinstance(n, (ast.Assign, ast.AugAssign, ast.Call)) and source_position(n) >= start), key=source_position)
    for node in later:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward" and holds(node.func.value):
            return True
        if isinstance(node, (ast.Assign, ast.AugAssign)) and holds(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            held |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return False
