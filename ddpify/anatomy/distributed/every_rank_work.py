"""Work every rank must join: collectives, training calls and what calls them, told apart from output
(prints, log records, writes) that rank 0 alone may make; which values in a rank-0 output
statement must be computed on every rank first; and whether those judgements of a statement
hold once edits planned on the code, not made yet, are made (`judged_alike_once_made`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable, Iterator

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.values import ROLE_MODEL
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.accelerate import accelerator_method, is_prepared_model
from ddpify.anatomy.distributed.fsdp import after_shard, is_sharded_model, sharded_origins
from ddpify.anatomy.distributed.names import COLLECTIVES
from ddpify.anatomy.distributed.ranks import only_called_from, rank_guarded
from ddpify.anatomy.distributed.wrappers import is_wrapper, may_become_wrapper, unwrapping_function
from ddpify.anatomy.sites import CallSite, ModelSite
from ddpify.anatomy.output import is_output_call, output_statements
from ddpify.anatomy.syntax import ancestors, argument, contains, enclosing_function
from ddpify.anatomy.vocabulary import ACCELERATOR_COLLECTIVES, ACCELERATOR_UNWRAP, FORWARD, is_pure_call


@per_anatomy
def collectives(a: Anatomy) -> list[CallSite]:
    return [c for c in a.calls if is_collective(a, c.node)]


def is_collective(a: Anatomy, call: ast.AST) -> bool:
    """`dist.all_reduce(t)`, `accelerator.wait_for_everyone()`, `accelerator.gather(t)`."""
    return isinstance(call, ast.Call) and (
        a.qualname(call.func) in COLLECTIVES or accelerator_method(a, call) in ACCELERATOR_COLLECTIVES)


def calls_collective(a: Anatomy, body: Iterable[ast.AST]) -> bool:
    """Does this code (or a local function it calls) run a collective?"""
    reaching = _functions_calling_collectives(a)
    return any(is_collective(a, n) or (isinstance(n, ast.Call) and a.callee(n) in reaching) for n in walk_body(body))


def function_calls_collective(a: Anatomy, scope: str) -> bool:
    """Does local function `scope` (or one it calls) run a collective? `calls_collective` of its
    body, answered from the per-anatomy set without walking the body again."""
    return scope in _functions_calling_collectives(a)


@per_anatomy
def _functions_calling_collectives(a: Anatomy) -> frozenset[str]:
    """The local functions that call a collective, themselves or through the local functions they
    call (what `a.function_contains(f, is_collective)` answers, for every f at once)."""
    found: set[str] = set()
    callees: dict[str, set[str]] = {}
    for scope, fn in a.functions.items():
        calls = [n for n in walk_body(fn.node.body) if isinstance(n, ast.Call)]
        if any(is_collective(a, call) for call in calls):
            found.add(scope)
        callees[scope] = {callee for call in calls if (callee := a.callee(call))}
    grown = True
    while grown:
        reached = {scope for scope, called in callees.items() if scope not in found and called & found}
        found |= reached
        grown = bool(reached)
    return frozenset(found)


def joins_every_rank(a: Anatomy, body: Iterable[ast.AST]) -> bool:
    """Does this code (or a local function it calls) train or call a collective?"""
    return a.body_contains(body, lambda n: _trains_or_syncs(a, n))


def _trains_or_syncs(a: Anatomy, node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    return a.is_training_call(node) or is_collective(a, node) or _runs_project_work(a, node)


def _runs_project_work(a: Anatomy, call: ast.Call) -> bool:
    """A call of another project file's function that may train, evaluate or join a collective."""
    exported = a.facts.imported.get(a.qualname(call.func) or "")
    return exported is not None and not exported.rank_zero_safe


def must_run_on_every_rank(a: Anatomy, call: ast.Call) -> bool:
    """Inside output that rank 0 alone will make (a print's f-string, a log's or a save's
    arguments): must this call run on every rank instead? Yes when it trains or calls a
    collective (itself, or through a function of this project), and when what it does is not
    known: a library's function, a method that is not a known read; when it runs the DDP wrapper's
    forward where that can't be unwrapped (`keeps_wrapper_forward`), or a model with BatchNorm
    (`runs_batchnorm`). No for pure formatting and
    reads (`_only_reads`), output calls, this file's functions that join nothing,
    and calls on a model (rank-0 code calls the module inside the wrapper)."""
    if joins_by_itself(a, call) or runs_sharded_model(a, call) or keeps_wrapper_forward(a, call) or runs_batchnorm(a, call):
        return True
    if _only_reads(a, call) or is_output_call(a, call) or a.callee(call) is not None or calls_model(a, call):
        return False
    return a.qualname(call.func) not in a.facts.imported  # another file's function joins nothing: judged there


def may_do_work_off_rank_zero(a: Anatomy, scope: str) -> bool:
    """Could calling function `scope` on rank 0 alone leave the other ranks behind or waiting: does it
    (or what it calls) make a call that must run on every rank, or call a model, which another file
    can't unwrap? Another file's view of this file's function (`Exported.rank_zero_safe`)."""
    return a.function_contains(scope, lambda n: isinstance(n, ast.Call) and (must_run_on_every_rank(a, n) or calls_model(a, n)))


def calls_model(a: Anatomy, call: ast.Call) -> bool:
    """`model(x)`, `model.module.describe()`: a model's forward or one of its methods."""
    node = call.func
    while True:
        if isinstance(node, (ast.Name, ast.Attribute)) and (a.has_role(node, ROLE_MODEL) or is_wrapper(a, node)):
            return True
        if not isinstance(node, ast.Attribute):
            return False
        node = node.value


def values_to_compute_first(a: Anatomy, stmt: ast.stmt) -> tuple[list[ast.expr], str | None]:
    """For an output statement that rank 0 alone will run (`print(f"acc {evaluate(model)}")`): the
    values in its arguments to compute on every rank just before it, left to right, so that the
    output alone can go on rank 0; and why that can't be done, if so. A call that must run on every
    rank is computed alone where it runs exactly once whenever the statement does; where it runs
    maybe or many times, the whole part around it (`a if c else b`, an `and`/`or`, a comprehension,
    the call a lambda is passed to)."""
    output = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(output, ast.Call) or joins_by_itself(a, output):
        return [], "the statement also trains or calls a collective, which every rank must join"
    found: list[ast.expr] = []
    for call in _outermost_work(a, output):
        value, reason = _part_to_compute(a, call, stmt)
        if reason is not None:
            return found, f"`{ast.unparse(call)}` must run on every rank and sits in {reason}"
        if value not in found:
            found.append(value)  # type: ignore[arg-type]
    outermost = [v for v in found if not any(o is not v and contains(o, lambda n, v=v: n is v) for o in found)]
    return sorted(outermost, key=lambda n: (n.lineno, n.col_offset)), None


def _outermost_work(a: Anatomy, output: ast.Call) -> list[ast.Call]:
    """The outermost calls in `output`'s arguments that must run on every rank."""
    def outermost(node: ast.AST) -> list[ast.Call]:
        if isinstance(node, ast.Call) and must_run_on_every_rank(a, node):
            return [node]
        return [inner for child in ast.iter_child_nodes(node) for inner in outermost(child)]

    return [inner for arg in ast.iter_child_nodes(output) for inner in outermost(arg)]


def _part_to_compute(a: Anatomy, call: ast.Call, stmt: ast.stmt) -> tuple[ast.AST, str | None]:
    """What to compute first so that `call` runs as often as it did: the call itself, or the
    outermost conditional or repeated part holding it; with the reason when that part can't be
    computed apart from the output (a lambda or a generator the output itself consumes)."""
    value: ast.AST = call
    for parent, child in ancestors(a, call):
        if parent is stmt:
            break
        part = _conditional_part(parent, child)
        if part is None:
            continue
        if isinstance(parent, ast.comprehension):
            parent = a.parents[parent]
        value = _consumer(a, parent) if isinstance(parent, (ast.Lambda, ast.GeneratorExp)) else parent
        if value is None or value is stmt.value:  # type: ignore[attr-defined]
            return call, part
    return value, None


def _consumer(a: Anatomy, node: ast.AST) -> ast.Call | None:
    """The call a lambda or a generator is passed to (`sorted(xs, key=lambda m: ...)`, `sum(... for ...)`)."""
    parent = a.parents.get(node)
    if isinstance(parent, ast.keyword):
        parent = a.parents.get(parent)
    return parent if isinstance(parent, ast.Call) and parent.func is not node else None


def runs_sharded_model(a: Anatomy, call: ast.Call) -> bool:
    """Under FSDP, a forward of the sharded model all-gathers its parameters, a collective: `model(x)`,
    or this file's function handed the model (`evaluate(model, loader)`) that calls it."""
    if not sharded_origins(a) or not after_shard(a, call):
        return False
    if isinstance(call.func, (ast.Name, ast.Attribute)) and is_sharded_model(a, call.func):
        return True
    callee = a.callee(call)
    return callee is not None and any(
        isinstance(arg, (ast.Name, ast.Attribute)) and is_sharded_model(a, arg) and _calls_parameter(a, callee, p)
        for i, p in enumerate(a.functions[callee].params) if (arg := argument(call, i, p)) is not None)


def may_run_wrapper_forward(a: Anatomy, call: ast.Call) -> bool:
    """`evaluate(model, loader)` with `model` the DDP wrapper: the callee may run the wrapper's
    forward, which broadcasts buffers to every rank. This file's function when it calls that
    parameter, or a wrapper it reads itself where every rank may run it too (`logits(x)` calling
    the global `model`, also in training; a forward only rank-guarded code runs is reported there,
    DDP002), through any depth of calls; another function when it is handed the wrapper, unless it
    only formats, reads or writes output."""
    if _only_reads(a, call) or is_output_call(a, call) or calls_model(a, call):
        return False
    callee = a.callee(call)
    if callee is None:
        return any(_is_wrapper_value(a, arg) for arg in (*call.args, *(k.value for k in call.keywords)))
    return any(_is_wrapper_value(a, argument(call, i, p)) and _calls_parameter(a, callee, p)
               for i, p in enumerate(a.functions[callee].params)) or a.function_contains(
        callee, lambda n: runs_wrapper_it_reads(a, n) and not rank_guarded(a, n))


def keeps_wrapper_forward(a: Anatomy, call: ast.Call) -> bool:
    """A call of this file's function that runs the DDP wrapper's forward (itself, or in a function
    it calls) in a function that reads the wrapper itself and that code every rank runs calls too
    (`logits(x)` of the training step, then `print(logits(x).shape)`): that function keeps the
    wrapper, so the call can't run on rank 0 alone."""
    callee = a.callee(call)
    every_rank = _called_outside_output(a)
    return callee is not None and a.function_contains(
        callee, lambda n: runs_wrapper_it_reads(a, n) and enclosing_function(a, n) in every_rank)


def runs_batchnorm(a: Anatomy, call: ast.Call) -> bool:
    """Does the call run the forward of a model that has (or may have) BatchNorm layers: the model or
    its wrapper called, or this file's function that calls one (`predict(x)`, `evaluate(model)`)? On
    GPUs they become SyncBatchNorm, whose forward in training mode gathers statistics from every
    rank: rank 0 can't run it alone, not even through `.module`."""
    callee = a.callee(call)
    return _forwards_batchnorm_model(a, call) or (callee is not None and a.function_contains(
        callee, lambda n: isinstance(n, ast.Call) and _forwards_batchnorm_model(a, n)))


def _forwards_batchnorm_model(a: Anatomy, call: ast.Call) -> bool:
    """`model(x)`, `model.forward(x)`, of a model whose BatchNorm layers ddpify makes SyncBatchNorm
    (has_batchnorm not False: its class has them, or is another file's)."""
    func = call.func.value if isinstance(call.func, ast.Attribute) and call.func.attr == FORWARD else call.func
    return isinstance(func, (ast.Name, ast.Attribute)) and any(
        role == ROLE_MODEL and isinstance(site, ModelSite) and site.has_batchnorm is not False for role, site in a.roles(func))


def runs_wrapper_it_reads(a: Anatomy, node: ast.AST) -> bool:
    """`model(x)` on the DDP wrapper, read where the function finds it (a global, the enclosing
    function's variable, `self.model`), not a parameter its callers hand it."""
    wrapper = wrapper_called(a, node)
    if wrapper is None:
        return False
    ref, fn = a.ref(wrapper), a.functions.get(enclosing_function(a, node))
    return ref is not None and not (fn is not None and ref.scope == fn.scope and ref.name in fn.params)


def wrapper_called(a: Anatomy, node: ast.AST) -> ast.expr | None:
    """The DDP wrapper whose forward the call `node` runs: `model(x)`, `model.forward(x)`."""
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Attribute) and func.attr == FORWARD and not is_wrapper(a, func):
        func = func.value
    return func if isinstance(func, (ast.Name, ast.Attribute)) and is_wrapper(a, func) else None


@per_anatomy
def _called_outside_output(a: Anatomy) -> set[str]:
    """The local functions that code outside output statements runs on every rank (the training
    step's `logits(x)`, or a call in an output's arguments that trains: `print(train_epoch())`),
    or whose callers can't be followed."""
    in_output: set[ast.AST] = set()
    for stmt in output_statements(a):
        nodes = set(ast.walk(stmt))
        trains = [n for n in nodes if isinstance(n, ast.Call) and joins_by_itself(a, n)]
        in_output |= nodes.difference(*(ast.walk(call) for call in trains))
    return set(a.functions) - only_called_from(a, in_output)


def wrappers_run(a: Anatomy, nodes: Iterable[ast.AST]) -> Iterator[ast.expr]:
    """The DDP wrappers that code made of `nodes` runs work through: called (`model(x)`,
    `model.forward(x)`), or handed to a local function (not one that unwraps it, as `plain_model` does)."""
    for node in nodes:
        if not isinstance(node, ast.Call):
            continue
        if (wrapper := wrapper_called(a, node)) is not None:
            yield wrapper
        elif (callee := a.callee(node)) and not unwrapping_function(a, callee):
            for arg in [*node.args, *(kw.value for kw in node.keywords)]:
                if isinstance(arg, (ast.Name, ast.Attribute)) and is_wrapper(a, arg):
                    yield arg


def _only_reads(a: Anatomy, call: ast.Call) -> bool:
    """A call that only formats, reads or measures (`vocabulary.is_pure_call`), or hands back the
    model inside a wrapper (`accelerator.unwrap_model(model)`, as `.module` does)."""
    return is_pure_call(a, call) or accelerator_method(a, call) == ACCELERATOR_UNWRAP


def _is_wrapper_value(a: Anatomy, expr: ast.AST | None) -> bool:
    """The DDP wrapper: `DDP(model)`'s, or the model `accelerator.prepare` returned."""
    return isinstance(expr, (ast.Name, ast.Attribute)) and (is_wrapper(a, expr) or is_prepared_model(a, expr))


def _calls_parameter(a: Anatomy, scope: str, param: str) -> bool:
    """Does function `scope` call its parameter `param` (`model(x)`) or hand it on to a call that
    does more than format or read it (`type(param)` does not)?"""
    def named(x: ast.AST) -> bool:
        return isinstance(x, ast.Name) and x.id == param

    def uses(n: ast.AST) -> bool:
        return isinstance(n, ast.Call) and (named(n.func) or (any(map(named, n.args)) and not is_pure_call(a, n)))
    return any(uses(n) for n in walk_body(a.functions[scope].node.body))


def joins_by_itself(a: Anatomy, call: ast.Call) -> bool:
    """Does the call train or call a collective (itself, or in the local function it calls), its arguments aside?"""
    callee = a.callee(call)
    return _trains_or_syncs(a, call) or (callee is not None and a.function_contains(callee, lambda n: _trains_or_syncs(a, n)))


def _conditional_part(parent: ast.AST, child: ast.AST) -> str | None:
    if isinstance(parent, ast.IfExp) and child is not parent.test:
        return "a branch of `a if c else b`"
    if isinstance(parent, ast.BoolOp) and child is not parent.values[0]:
        return "an operand of `and`/`or` that may not run"
    if isinstance(parent, ast.Lambda):
        return "a lambda"
    if isinstance(parent, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) and child is not parent.generators[0]:
        return "a comprehension"
    if isinstance(parent, ast.comprehension) and child is not parent.iter:
        return "a comprehension"
    return None


@dataclass(frozen=True)
class PendingEdits:
    """Edits planned on the code and not made yet, as a judgement planned ahead of them reads them
    (ddpify.edits.engine's Edits.as_pending; ddpify.codemods.pipeline): the statements they insert
    at, rewrite or group, those rewritten in place (into one statement standing for each: a loss
    print that prints the loss's mean over ranks), and the lines of the expressions they rewrite."""

    statements: frozenset[ast.stmt]
    in_place: frozenset[ast.stmt]
    expression_lines: frozenset[int]


def judged_alike_once_made(a: Anatomy, stmt: ast.stmt, pending: PendingEdits) -> bool:
    """Would the every-rank judgements of `stmt` (joins_every_rank, values_to_compute_first, is_wrapper
    and is_sharded_model of what it calls or hands on) be the same on the code `pending` produces?
    Conservatively: yes where the edits touch nothing in it or in a local function it calls (they may
    add a collective there: the evaluation's `all_reduce_sums`), where neither it nor a local function
    it calls reads a model (the wrap or the shard may make it a wrapper or a sharded model; unless `a`
    shows the pending wraps made, ddpify.anatomy.distributed.wraps_made), and where an edit of the
    statement itself is a rewrite in place of an output whose every call only reads (the names it
    reads may change)."""
    if not a.wraps_made and a.body_contains([stmt], lambda n: isinstance(n, ast.expr) and may_become_wrapper(a, n)):
        return False
    if stmt in pending.statements or _holds_rewritten_expression(stmt, pending):
        if not _only_reads_once_rewritten(a, stmt, pending):
            return False
    return not a.body_contains([stmt], lambda n: n is not stmt and isinstance(n, ast.stmt) and (
        n in pending.statements or _holds_rewritten_expression(n, pending)))


def _holds_rewritten_expression(stmt: ast.stmt, pending: PendingEdits) -> bool:
    """Is an expression on the statement's own lines (a compound's header) rewritten?"""
    body = getattr(stmt, "body", None)
    last = body[0].lineno - 1 if isinstance(body, list) and body and isinstance(body[0], ast.stmt) else stmt.end_lineno
    return any(line in pending.expression_lines for line in range(stmt.lineno, (last or stmt.lineno) + 1))


def _only_reads_once_rewritten(a: Anatomy, stmt: ast.stmt, pending: PendingEdits) -> bool:
    """An output rewritten in place, whose calls in its arguments only format or read."""
    output = stmt.value if isinstance(stmt, ast.Expr) else None
    return (stmt in pending.in_place and isinstance(output, ast.Call) and is_output_call(a, output)
            and all(is_pure_call(a, n) for n in ast.walk(output) if isinstance(n, ast.Call) and n is not output))
