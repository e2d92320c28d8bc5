"""The loop pass of the analysis: the step loops that iterate a loader, the epoch loops around training,
passes drawn with `iter()`/`next()`, and training another project file runs on this file's loaders."""

from __future__ import annotations

import ast

from ddpify.anatomy.facts import EPOCHS, STEPS
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import LoaderSite, LoopSite
from ddpify.anatomy.values import ROLE_LOADER, argument_for
from ddpify.anatomy.vocabulary import ITERATION_WRAPPERS


def find_loops(a: Anatomy) -> None:
    """Step loops iterate a loader; epoch loops contain training step loops (maybe via calls)."""
    for node in a.nodes_of(ast.For, ast.AsyncFor):
        loaders = _iterated_loaders(a, node.iter)
        if loaders:
            trains = a.body_contains(node.body, a.is_training_call)
            a.step_loops.append(a.site(node, LoopSite, loader=loaders[0], zipped=tuple(loaders[1:]), loop_var=_loop_var(node),
                                       trains=trains))  # type: ignore[arg-type]
            for loader in loaders if trains else ():
                loader.is_train = True
    _find_delegated_training(a)
    _find_iterator_passes(a)
    train_loop_nodes = {loop.node for loop in (*a.step_loops, *a.delegated_steps) if loop.trains}
    step_loop_nodes = {loop.node for loop in a.step_loops}
    for node in a.nodes_of(ast.For, ast.AsyncFor, ast.While):
        if node not in step_loop_nodes:
            if a.body_contains(node.body, lambda n: n in train_loop_nodes):
                a.epoch_loops.append(a.site(node, LoopSite, loop_var=_loop_var(node), trains=True))  # type: ignore[arg-type]


def _find_iterator_passes(a: Anatomy) -> None:
    """`data_iter = iter(loader)` whose `next(data_iter)` a training loop draws its batches from, and
    `iter(loader)` inside a training loop (a restart on StopIteration, or `next(iter(loader))` each
    step): the loader feeds training, one pass per `iter()` call."""
    for node in a.nodes_of(ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id == "iter" and len(node.args) == 1):
            continue
        loaders = a.chosen_loaders(node.args[0])
        a.loader_iters += [(node, loader) for loader in loaders]
        loop = next((lp for lp in a.enclosing(node, (ast.For, ast.While)) if a.body_contains(lp.body, a.is_training_call)), None)
        if loaders and (loop is not None or _drawn_from_in_training(a, node)):
            for loader in loaders:
                loader.is_train = True
                a.iterator_passes.append((node, loader, loop))  # type: ignore[arg-type]


def _drawn_from_in_training(a: Anatomy, call: ast.Call) -> bool:
    """Is the iterator that `it = iter(...)` makes read by a `next(it)` inside a loop that trains?"""
    assign = a.parents.get(call)
    if not (isinstance(assign, ast.Assign) and assign.value is call and len(assign.targets) == 1):
        return False
    ref = a.ref(assign.targets[0])
    for node in a.nodes_of(ast.Call):
        if (isinstance(node.func, ast.Name) and node.func.id == "next" and node.args
                and a.ref(node.args[0]) == ref and ref is not None):
            if any(a.body_contains(lp.body, a.is_training_call) for lp in a.enclosing(node, (ast.For, ast.While))):
                return True
    return False


def _find_delegated_training(a: Anatomy) -> None:
    """Loaders of this file that another file trains on: handed to its function, or returned to it."""
    for call in a.calls:
        exported = a.facts.imported.get(call.qualname)
        for param, mode in exported.trains if exported else ():
            arg = argument_for(call.node, exported.params.index(param), param)  # type: ignore[arg-type, union-attr]
            for loader in a.origins(arg, ROLE_LOADER) if arg is not None else ():
                if mode == EPOCHS:
                    loader.is_train = loader.handled_elsewhere = True  # type: ignore[attr-defined]
                else:
                    loader.is_train = loader.is_train or mode == STEPS  # type: ignore[attr-defined]
                    a.delegated_steps.append(a.site(call.node, LoopSite, loader=loader, trains=mode == STEPS))  # type: ignore[arg-type]
    for scope, index in a.facts.returned_elsewhere:
        returned = a.returns.get(scope, ()) if index is None else a.item_returns.get((scope, index), ())
        for role, origin in returned:
            if role == ROLE_LOADER and isinstance(origin, LoaderSite):
                origin.handled_elsewhere = True
                origin.is_train = origin.is_train or (scope, index) in a.facts.trained_returns


def _iterated_loaders(a: Anatomy, expr: ast.AST) -> list[LoaderSite]:
    """The loaders a loop walks: `loader`, `enumerate(tqdm(loader))`, each of `zip(loader_a, loader_b)`."""
    while isinstance(expr, ast.Call) and (a.qualname(expr.func) in ITERATION_WRAPPERS) and expr.args:
        if a.qualname(expr.func) == "zip":
            return [site for arg in expr.args for site in _iterated_loaders(a, arg)]
        expr = expr.args[0]
    if isinstance(expr, ast.Call) and expr in a.loader_sites:
        return [a.loader_sites[expr]]
    return a.chosen_loaders(expr) or sorted(a.origins(expr, ROLE_LOADER), key=lambda s: s.line)[:1]  # type: ignore[return-value]


def _loop_var(loop: ast.For | ast.AsyncFor | ast.While) -> str | None:
    """`epoch` in `for epoch in ...` and in `for epoch, item in enumerate(...)`; in `while ...:`,
    the variable its body counts passes with (`epoch += 1`, in the body itself, not a nested loop)."""
    if isinstance(loop, ast.While):
        return _pass_counter(loop.body)
    target = loop.target
    if isinstance(target, ast.Tuple) and target.elts and isinstance(loop.iter, ast.Call):
        if isinstance(loop.iter.func, ast.Name) and loop.iter.func.id == "enumerate":
            target = target.elts[0]
    return target.id if isinstance(target, ast.Name) and target.id != "_" else None


def _pass_counter(body: list[ast.stmt]) -> str | None:
    """`epoch` where the statements hold `epoch += 1` (the first such name)."""
    for stmt in body:
        if (isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and isinstance(stmt.target, ast.Name)
                and isinstance(stmt.value, ast.Constant) and stmt.value.value == 1):
            return stmt.target.id
    return None
