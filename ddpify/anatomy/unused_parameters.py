"""Whether a backward can leave some of a model's parameters without a gradient.

DDP expects every parameter to get a gradient in every backward unless it is built with
`find_unused_parameters=True`; otherwise the next iteration fails ("Expected to have finished
reduction in the prior iteration"). Two shapes do that: a forward that calls a submodule only on some
path (`if self.do_bn: x = self.bn(x)`), and a step that back-propagates only some of the outputs of
a model that returns several (`validity, _, _ = discriminator(x)`).
"""

from __future__ import annotations

import ast

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.values import ROLE_MODEL, ModelClass
from ddpify.anatomy.sites import ModelSite

BRANCHES = (ast.If, ast.IfExp, ast.Try, ast.While, ast.Break, ast.Match)


def may_leave_parameters_unused(a: Anatomy, model: ModelSite) -> bool:
    """Can a backward of `model` leave parameters without a gradient (judged where the model is in sight)?"""
    return any(calls_submodules_on_some_paths(c) for c in _classes_of(a, model)) or _drops_outputs(a, model)


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


def calls_submodules_on_some_paths(model_class: ModelClass) -> bool:
    """Does a branch of the forward (or a method it calls) call a `self.` attribute the other paths may not?"""
    return any(
        isinstance(branch, BRANCHES) and any(isinstance(n, ast.Call) and is_self_attribute(n.func) for n in ast.walk(branch))
        for method in methods_reached(model_class) for branch in ast.walk(method)
    )


def is_self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _drops_outputs(a: Anatomy, model: ModelSite) -> bool:
    """Does a step drop an output of `model` that a head of its own computes (`validity, _, _ =
    discriminator(x)` where each output is `self.<head>(...)`): that head's parameters get no gradient."""
    heads = {i for c in _classes_of(a, model) for i in _head_outputs(c)}
    for node in a.nodes:
        if not (heads and isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
                and any(o.node is model.node for o in a.origins(node.func, ROLE_MODEL))):
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
