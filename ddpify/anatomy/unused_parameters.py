"""Whether a backward can leave some of a model's parameters without a gradient.

DDP expects every parameter to get a gradient in every backward unless it is built with
`find_unused_parameters=True`; otherwise the next iteration fails ("Expected to have finished
reduction in the prior iteration"). Three shapes do that: a forward that calls a submodule only on some
path (`if self.do_bn: x = self.bn(x)`), a submodule `__init__` builds that the forward never calls
(`self.label_emb = nn.Embedding(...)` left over from a conditional model), and a step that
back-propagates only some of the outputs of a model that returns several (`validity, _, _ = discriminator(x)`).
"""

from __future__ import annotations

import ast

from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.values import ROLE_MODEL, ModelClass
from ddpify.anatomy.vocabulary import NOT_MODELS, PARAMETER_CONSTRUCTOR, PARAMETER_FREE_LAYERS, RANDOM_DRAWS, SUBMODULE_WALKS
from ddpify.anatomy.distributed.names import NUMPY_RANDOM, PYTHON_DRAWS, TORCH
from ddpify.anatomy.sites import ModelSite

BRANCHES = (ast.If, ast.IfExp, ast.Try, ast.While, ast.Break, ast.Match)


def may_leave_parameters_unused(a: Anatomy, model: ModelSite) -> bool:
    """Can a backward of `model` leave parameters without a gradient (judged where the model is in sight)?"""
    judged = _judged_models(a)
    if model.node not in judged:
        classes = _classes_of(a, model)
        judged[model.node] = (any(calls_submodules_on_some_paths(a, c) or submodules_never_called(a, c) for c in classes)
                              or _drops_outputs(a, model))
    return judged[model.node]


@per_anatomy
def _judged_models(a: Anatomy) -> dict[ast.AST, bool]:
    """may_leave_parameters_unused's answers so far, by the model's constructor call: the wrap asks for
    its options and again for its report."""
    return {}


def _classes_of(a: Anatomy, model: ModelSite) -> list[ModelClass]:
    """The model classes of this file that `model` holds (each of a list or dict of models too)."""
    if model.class_name in a.model_classes:
        return [a.model_classes[model.class_name]]
    built = [a.qualname(n.func) for n in ast.walk(model.node) if isinstance(n, ast.Call)] if model.container else []
    return [a.model_classes[q] for q in dict.fromkeys(built) if q in a.model_classes]


def methods_reached(model_class: ModelClass) -> list[ast.FunctionDef]:
    """`forward` and the methods of its class it calls, transitively."""
    by_name = {n.name: n for n in model_class.node.body if isinstance(n, ast.FunctionDef)}
    forward = model_class.forward
    seen: list[ast.FunctionDef] = []
    todo = [forward] if forward is not None else []
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.append(fn)
        todo += [by_name[n.func.attr] for n in ast.walk(fn) if isinstance(n, ast.Call) and is_self_attribute(n.func) and n.func.attr in by_name]
    return seen


def calls_submodules_on_some_paths(a: Anatomy, model_class: ModelClass) -> bool:
    """Does a branch of the forward (or a method it calls) call a `self.` attribute the other paths may not?
    A loop run a random number of times (`for _ in range(random.randint(0, 3))`) may run none."""
    return any(
        (isinstance(branch, BRANCHES) and _calls_a_submodule(branch))
        or (isinstance(branch, ast.For) and _drawn_at_random(a, branch.iter) and any(_calls_a_submodule(s) for s in branch.body))
        for method in methods_reached(model_class) for branch in ast.walk(method)
    )


def _calls_a_submodule(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and is_self_attribute(n.func) for n in ast.walk(node))


def _drawn_at_random(a: Anatomy, expr: ast.expr) -> bool:
    """Does `expr` draw from Python's, numpy's or torch's global RNG (`random.randint(0, 3)`)?"""
    for call in (n for n in ast.walk(expr) if isinstance(n, ast.Call)):
        qualname = a.qualname(call.func) or ""
        module, _, name = qualname.rpartition(".")
        if qualname in PYTHON_DRAWS or qualname.startswith(NUMPY_RANDOM) or (module == TORCH and name in RANDOM_DRAWS):
            return True
    return False


def submodules_never_called(a: Anatomy, model_class: ModelClass) -> set[str]:
    """The submodules and parameters the class assigns (`self.label_emb = nn.Embedding(...)`) that no method
    its forward reaches names; empty when the forward may reach them without naming them (`self.children()`,
    `getattr(self, name)`, `self` handed on)."""
    reached = methods_reached(model_class)
    if not reached or any(_reaches_submodules_unnamed(a, method) for method in reached):
        return set()
    named = {n.attr for method in reached for n in ast.walk(method) if is_self_attribute(n)}
    return {attr for attr, value in _assigned_attributes(model_class)
            if attr not in named | _aliased_in_init(model_class) and _holds_parameters(a, value)}


def _aliased_in_init(model_class: ModelClass) -> set[str]:
    """Attributes `__init__` reads (`m = self.mlp; self.mlpf = lambda x: m.c_proj(x)`): the forward may call them so."""
    init = next((n for n in model_class.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    return {n.attr for n in ast.walk(init) if is_self_attribute(n) and isinstance(n.ctx, ast.Load)} if init else set()


def _reaches_submodules_unnamed(a: Anatomy, method: ast.FunctionDef) -> bool:
    """Does the method use `self` but as `self.<attribute>`, or walk its submodules (`self.children()`)?"""
    me = method.args.args[0].arg if method.args.args else None
    for node in ast.walk(method):
        if isinstance(node, ast.Name) and node.id == me:
            parent = a.parents.get(node)
            if not isinstance(parent, ast.Attribute) or parent.attr in SUBMODULE_WALKS:
                return True
    return False


def _assigned_attributes(model_class: ModelClass) -> list[tuple[str, ast.expr]]:
    """(attribute, value) of each `self.<attribute> = <value>` in the class (`self.a, self.b = x, y` too)."""
    pairs = []
    for node in ast.walk(model_class.node):
        for target in node.targets if isinstance(node, ast.Assign) else []:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(target.elts) == len(node.value.elts):
                pairs += zip(target.elts, node.value.elts)
            else:
                pairs.append((target, node.value))
    return [(t.attr, value) for t, value in pairs if is_self_attribute(t)]  # type: ignore[attr-defined]


def _holds_parameters(a: Anatomy, value: ast.expr) -> bool:
    """Is `value` a call that builds a layer (`nn.Embedding(...)`), a model of this file, or an `nn.Parameter`?"""
    if not isinstance(value, ast.Call):
        return False
    qualname = a.qualname(value.func) or ""
    layer = (qualname.startswith("torch.nn.") and qualname.rsplit(".", 1)[-1][:1].isupper()
             and qualname not in NOT_MODELS and not PARAMETER_FREE_LAYERS.match(qualname))
    return layer or qualname == PARAMETER_CONSTRUCTOR or qualname in a.model_classes


def is_self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _drops_outputs(a: Anatomy, model: ModelSite) -> bool:
    """Does a step drop an output of `model` that a head of its own computes (`validity, _, _ =
    discriminator(x)` where each output is `self.<head>(...)`): that head's parameters get no gradient."""
    heads = {i for c in _classes_of(a, model) for i in _head_outputs(c)}
    if not heads:
        return False
    for node in a.nodes_of(ast.Call):
        if not (isinstance(node.func, (ast.Name, ast.Attribute))
                and any(_built_by(model, o.node) for o in a.origins(node.func, ROLE_MODEL))):
            continue
        parent = a.parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node and isinstance(parent.slice, ast.Constant):
            dropped = heads - {parent.slice.value}
        elif isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], (ast.Tuple, ast.List)):
            dropped = {i for i, e in enumerate(parent.targets[0].elts) if isinstance(e, ast.Name) and e.id.startswith("_")}
        else:
            continue
        if dropped & heads:
            return True
    return False


def _built_by(model: ModelSite, origin: ast.AST) -> bool:
    """Is `origin` the model's constructor call (`Discriminator()` of `Discriminator().to(device)`)?"""
    return any(n is origin for n in ast.walk(model.node))


def _head_outputs(model_class: ModelClass) -> set[int]:
    """Positions of the tuple `forward` returns whose value a submodule call makes (`return self.a(h), self.b(h)`,
    or a name last bound to such a call)."""
    forward = model_class.forward
    if forward is None:
        return set()
    bound = {t.id: stmt.value for stmt in ast.walk(forward) if isinstance(stmt, ast.Assign) for t in stmt.targets if isinstance(t, ast.Name)}
    heads = set()
    for ret in (n for n in ast.walk(forward) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)):
        elts = ret.value.elts  # type: ignore[union-attr]
        for i, elt in enumerate(elts):
            value = bound.get(elt.id) if isinstance(elt, ast.Name) else elt
            others = [n.id for j, e in enumerate(elts) if j != i for v in (e, bound.get(getattr(e, "id", ""))) if v is not None
                      for n in ast.walk(v) if isinstance(n, ast.Name)]
            if _submodule_call(value) and not (isinstance(elt, ast.Name) and elt.id in others):
                heads.add(i)  # not an input of the other outputs (`return out, loss_of(out)`)
    return heads


def _submodule_call(value: ast.AST | None) -> bool:
    """`self.head(h)`, possibly followed by a method (`self.head(h).squeeze(1)`)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and not is_self_attribute(value.func):
        value = value.func.value
    return isinstance(value, ast.Call) and is_self_attribute(value.func)
