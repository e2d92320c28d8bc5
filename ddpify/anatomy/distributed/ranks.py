"""Ranks: values that hold one (`rank`, `dist.get_rank()`), conditions that differ between ranks
(`if rank == 0:`, `is_main_process()`, early exits under them), and which code runs on every rank
(under torchrun, or in what an `mp.spawn` worker reaches).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from typing import Iterator

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.accelerate import accelerator_attribute
from ddpify.anatomy.distributed.names import DIST, ENVIRONMENT_READS, RANK_VARIABLES, SPAWN_CALLS
from ddpify.anatomy.distributed.reaching import MAX_DEPTH, assignments, callers, callers_by_scope, returned_values
from ddpify.anatomy.sites import MODULE_SCOPE, ScriptKind
from ddpify.anatomy.syntax import ancestors, argument, constant, contains, enclosing_function, identifier
from ddpify.anatomy.vocabulary import ACCELERATOR_RANK_VALUES

_RANK_NAME = re.compile(r"^(?:\w+_)?rank(?:_id)?$|^(?:gpu|gpu_id|local_gpu)$", re.IGNORECASE)
_MAIN_PROCESS_NAME = re.compile(
    r"^_?(?:is_)?(?:local_)?(?:main|master|primary|chief|rank_?0|rank_?zero|global_zero)"
    r"(?:_process|_proc|_rank|_node|_worker)?$",
    re.IGNORECASE,
)
_RANK_FUNCTIONS = frozenset({f"{DIST}.get_rank", f"{DIST}.get_node_local_rank", f"{DIST}.get_global_rank"})


def is_rank_value(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """`rank`, `args.local_rank`, `self.gpu_id`, `dist.get_rank()`, a spawn worker's first parameter."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(expr, ast.Call):
        if a.qualname(expr.func) in _RANK_FUNCTIONS:
            return True
        name = identifier(expr.func)
        if name in ("get_rank", "get_local_rank", "get_global_rank"):
            return True
        if name == "int" and expr.args:
            return is_rank_value(a, expr.args[0], depth + 1)
        return a.qualname(expr.func) in ENVIRONMENT_READS and bool(expr.args) and constant(expr.args[0], *RANK_VARIABLES)
    if isinstance(expr, ast.BinOp):  # args.rank % ngpus_per_node
        return is_rank_value(a, expr.left, depth + 1) or is_rank_value(a, expr.right, depth + 1)
    if isinstance(expr, ast.Subscript):  # os.environ["LOCAL_RANK"]
        key = expr.slice
        return constant(key, *RANK_VARIABLES)
    if accelerator_attribute(a, expr) in ACCELERATOR_RANK_VALUES:  # accelerator.process_index
        return True
    name = identifier(expr)
    if name is None:
        return False
    if _RANK_NAME.match(name):
        return True
    return isinstance(expr, ast.Name) and expr.id in _worker_rank_parameters(a).get(a.scope_of.get(expr, MODULE_SCOPE), ())


@per_anatomy
def _worker_rank_parameters(a: Anatomy) -> dict[str, set[str]]:
    """The first parameter of each mp.spawn worker: the process index, i.e. the rank."""
    found: dict[str, set[str]] = {}
    for scope in spawn_workers(a):
        params = a.functions[scope].params
        if params:
            found[scope] = {params[0]}
    return found


def is_rank_test(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """Is this condition true on some ranks and false on others?

    `rank == 0`, `dist.get_rank() != 0`, `local_rank in (-1, 0)`, `is_main_process()`, `master_process`,
    `not is_main`, `x and rank == 0`. Comparing a rank with -1 or None only (`local_rank != -1`,
    "are we distributed at all") is the same on every rank and is not a rank test.
    """
    if depth > MAX_DEPTH:
        return False
    if isinstance(expr, ast.BoolOp):
        return any(is_rank_test(a, v, depth + 1) for v in expr.values)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return is_rank_test(a, expr.operand, depth + 1)
    if isinstance(expr, ast.Compare):
        return _is_rank_compare(a, expr)
    if isinstance(expr, ast.Call):
        name = identifier(expr.func)
        if name and _MAIN_PROCESS_NAME.match(name):
            return True
        callee = a.callee(expr)  # a local function that returns a rank test (`def is_main(): return rank == 0`)
        return callee is not None and any(is_rank_test(a, v, depth + 1) for v in returned_values(a, callee))
    name = identifier(expr)
    if name is None:
        return False
    if _MAIN_PROCESS_NAME.match(name):
        return True
    ref = a.ref(expr)
    values = [v for _, v in assignments(a).get(ref, ())] if ref else []
    return any(is_rank_test(a, v, depth + 1) for v in values)


def _is_rank_compare(a: Anatomy, cmp: ast.Compare) -> bool:
    sides = [cmp.left, *cmp.comparators]
    if not any(is_rank_value(a, s) for s in sides):
        return False
    literals = [s for s in sides if isinstance(s, (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.UnaryOp))]
    if len(literals) < len(sides) - 1:
        return True  # rank compared with another variable (`rank == src`)
    return any(_means_a_real_rank(lit) for lit in literals)


def _means_a_real_rank(literal: ast.AST) -> bool:
    """A literal naming a rank, not the "not distributed" markers -1 and None."""
    if isinstance(literal, (ast.Tuple, ast.List, ast.Set)):
        return any(_means_a_real_rank(e) for e in literal.elts)
    return isinstance(literal, ast.Constant) and isinstance(literal.value, int) and not isinstance(literal.value, bool) and literal.value >= 0


def is_rank_zero_test(a: Anatomy, expr: ast.AST) -> bool:
    """A rank test that holds on rank 0: `rank == 0`, `rank in (-1, 0)`, `is_main_process()`, `a and rank == 0`."""
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And):
        return any(is_rank_zero_test(a, v) for v in expr.values) and not any(_negates_rank(a, v) for v in expr.values)
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and is_rank_value(a, expr.left):
        op, right = expr.ops[0], expr.comparators[0]
        if isinstance(op, ast.Eq):
            return constant(right, 0)
        if isinstance(op, ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            return any(constant(e, 0) for e in right.elts)
        return False
    if isinstance(expr, ast.UnaryOp):
        return False
    return is_rank_test(a, expr) and not isinstance(expr, ast.Compare)


def _negates_rank(a: Anatomy, expr: ast.AST) -> bool:
    return isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not) and is_rank_test(a, expr.operand)


def exits(a: Anatomy, body: list[ast.stmt]) -> bool:
    """Does this block end by leaving the function (return, raise, sys.exit)?"""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    return isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and a.qualname(last.value.func) in (
        "sys.exit", "exit", "quit", "os._exit")


def conditions_on(a: Anatomy, node: ast.AST) -> Iterator[ast.expr]:
    """The tests that decide whether `node` runs, within its function: those of the `if`s (and
    `x if test else y`) around it, the operands before it of an `and`/`or`, and those of earlier
    `if <test>: return` statements."""
    for parent, child in ancestors(a, node):
        if isinstance(child, ast.stmt):
            block = a.block_of(child)
            if child in block:
                yield from (s.test for s in block[: block.index(child)] if isinstance(s, ast.If) and exits(a, s.body))
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            yield parent.test
        if isinstance(parent, ast.BoolOp):
            yield from parent.values[: parent.values.index(child)]  # type: ignore[arg-type]  # `rank == 0 and validate(m)`


def rank_guard(a: Anatomy, node: ast.AST) -> ast.If | None:
    """The innermost `if <rank test>:` whose body or else-branch holds `node`, in its function."""
    for parent, child in ancestors(a, node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None
        if isinstance(parent, ast.If) and child is not parent.test and is_rank_test(a, parent.test):
            return parent
    return None


def under_rank_test(a: Anatomy, node: ast.AST) -> bool:
    """Is one of the tests that decide whether `node` runs within its function (conditions_on's) a
    rank test? Those around its statement are judged once per statement."""
    child, parent = node, a.parents.get(node)
    while parent is not None and not isinstance(child, ast.stmt):
        if isinstance(parent, _DEFINITIONS):
            return False
        if isinstance(parent, ast.IfExp) and child is not parent.test and is_rank_test(a, parent.test):
            return True
        if isinstance(parent, ast.BoolOp) and any(is_rank_test(a, v) for v in parent.values[: parent.values.index(child)]):  # type: ignore[arg-type]
            return True
        child, parent = parent, a.parents.get(parent)
    return isinstance(child, ast.stmt) and _statement_under_rank_test(a, child)


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _statement_under_rank_test(a: Anatomy, stmt: ast.stmt) -> bool:
    judged = _statements_judged(a)
    if stmt not in judged:
        judged[stmt] = _rank_exit_before(a, stmt) or _block_under_rank_test(a, stmt)
    return judged[stmt]


@per_anatomy
def _statements_judged(a: Anatomy) -> dict[ast.stmt, bool]:
    """under_rank_test's answers so far for the tests around whole statements (rules and rank 0 ask
    them of every call)."""
    return {}


def _rank_exit_before(a: Anatomy, stmt: ast.stmt) -> bool:
    """Does an earlier statement of its block leave under a rank test (`if rank != 0: return`)?"""
    block = a.block_of(stmt)
    return any(isinstance(s, ast.If) and exits(a, s.body) and is_rank_test(a, s.test) for s in block[: block.index(stmt)])


def _block_under_rank_test(a: Anatomy, stmt: ast.stmt) -> bool:
    """Is the block that holds `stmt` in a branch of a rank test, or its compound statement under one?"""
    parent = a.parents.get(stmt)
    while parent is not None and not isinstance(parent, _DEFINITIONS):
        if isinstance(parent, ast.If) and is_rank_test(a, parent.test):
            return True
        if isinstance(parent, ast.stmt):
            return _statement_under_rank_test(a, parent)
        parent = a.parents.get(parent)  # an except clause or a match case: its try or match
    return False


def rank_guarded(a: Anatomy, node: ast.AST, _seen: frozenset[str] = frozenset()) -> bool:
    """Does `node` run on some ranks only: under a rank test, after a rank exit, or in a function
    that is only ever called from such places?"""
    if under_rank_test(a, node):
        return True
    scope = enclosing_function(a, node)
    if scope == MODULE_SCOPE or scope in _seen:
        return False
    calls = callers(a, scope)
    return bool(calls) and all(rank_guarded(a, c, _seen | {scope}) for c in calls)


def only_called_from(a: Anatomy, calls: set[ast.AST]) -> set[str]:
    """The local functions each of whose calls is one of `calls`, under a rank test, or in another
    such function (which may be itself): what runs only where those calls run, or on some ranks."""
    found = {scope for scope in a.functions if callers(a, scope)}
    while True:
        called_elsewhere = {scope for scope in found if not all(
            call in calls or enclosing_function(a, call) in found or rank_guarded(a, call) for call in callers(a, scope))}
        if not called_elsewhere:
            return found
        found -= called_elsewhere


@per_anatomy
def spawn_workers(a: Anatomy) -> set[str]:
    """Functions handed to `mp.spawn(fn, ...)`."""
    found = set()
    for site in a.calls_to(*SPAWN_CALLS):
        fn = argument(site.node, 0, "fn")  # type: ignore[arg-type]
        if isinstance(fn, ast.Name) and fn.id in a.functions:
            found.add(fn.id)
    return found


@per_anatomy
def _reachable_from_workers(a: Anatomy) -> set[str]:
    callees: dict[str, set[str]] = defaultdict(set)
    for scope, calls in callers_by_scope(a).items():
        for call in calls:
            callees[enclosing_function(a, call)].add(scope)
    seen, todo = set(), list(spawn_workers(a))
    while todo:
        scope = todo.pop()
        if scope not in seen:
            seen.add(scope)
            todo.extend(callees.get(scope, ()))
    return seen


def runs_on_every_rank(a: Anatomy, node: ast.AST) -> bool:
    """Does `node` run in every rank's process, unguarded by a rank test?

    Under torchrun every process runs the whole script; in an mp.spawn script only what the
    worker reaches (and module-level code outside the `__main__` block) runs in the ranks.
    """
    if rank_guarded(a, node):
        return False
    if a.kind is not ScriptKind.SPAWN:
        return True
    scope = enclosing_function(a, node)
    if scope == MODULE_SCOPE:
        return a.main_guard is None or not any(p is a.main_guard for p, _ in ancestors(a, node))
    return scope in _reachable_from_workers(a)


def mentions_rank(a: Anatomy, expr: ast.AST, through_variables: bool = True) -> bool:
    """Does `expr` (or, `through_variables`, a variable it reads, one assignment deep) depend on the rank?"""
    for node in ast.walk(expr):
        if is_rank_value(a, node):
            return True
        if through_variables and isinstance(node, ast.Name):
            ref = a.ref(node)
            if ref and any(contains(v, lambda n: is_rank_value(a, n)) for _, v in assignments(a).get(ref, ())):
                return True
    return False
