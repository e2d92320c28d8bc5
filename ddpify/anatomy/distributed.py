"""What a DDP script does across ranks, read from its `Anatomy` by the DDP lint rules and codemods.

Rank conditions (`if rank == 0:`, `if dist.get_rank() == 0`, `if is_main_process():`, early
`return`s under them), collectives, DDP wrappers and what they wrap, DistributedSamplers, seeding,
environment writes, `--local_rank` arguments and the process-group backend.

Every function takes an `Anatomy`; whole-script results are cached on it (`per_anatomy`), so rules
that ask the same question share one answer. Values are followed the way `Anatomy.roles` follows them,
but where the analysis is flow-insensitive, the DDP questions are not: `model` is the plain model
before `model = DDP(model)` and the wrapper after it, so `wrapper_value` reads the assignment that
reaches the use.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from typing import Callable, Iterable, Iterator

from ddpify.anatomy.analyzer import ROLE_LOGGER, ROLE_MODEL, ROLE_WRITER, Anatomy, walk_body
from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite, LoaderSite, Ref, ScriptKind
from ddpify.anatomy.syntax import ancestors, argument, constant, contains, enclosing_function, identifier, keyword, method_name
from ddpify.anatomy.vocabulary import (
    DDP_WRAPPER, FILE_WRITE_CALLS, FILE_WRITE_METHODS, ITERABLE_DATASETS, LEGACY_FSDP, LOG_METHODS, MODULE_RETURNING_SELF, OPEN_CALLS,
    RANDOM_DRAWS, RANDOM_FILLS, is_pure_call,
)

DIST = "torch.distributed"
COLLECTIVES = frozenset(
    f"{DIST}.{name}"
    for name in (
        "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_gather_coalesced",
        "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier",
        "broadcast", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
        "gather", "gather_object", "scatter", "scatter_object_list", "new_group",
    )
) | frozenset({  # distributed checkpoints (DCP): every rank writes, or reads, its own shards together
    f"{DIST}.checkpoint.save", f"{DIST}.checkpoint.load",
    f"{DIST}.checkpoint.state_dict_saver.save", f"{DIST}.checkpoint.state_dict_loader.load",
})
DCP_MODULE = f"{DIST}.checkpoint"
# FSDP2's per-module sharding (public since torch 2.6; `_composable` before), and legacy FSDP.
FULLY_SHARD = frozenset({f"{DIST}.fsdp.fully_shard", f"{DIST}._composable.fsdp.fully_shard"})
# Legacy FSDP's state-dict modes whose `state_dict()` holds this rank's shards only (entered with
# `FSDP.state_dict_type(model, StateDictType.<mode>)` or set with `FSDP.set_state_dict_type`).
LEGACY_STATE_DICT_MODES = frozenset({f"{LEGACY_FSDP}.state_dict_type", f"{LEGACY_FSDP}.set_state_dict_type"})
SHARDED_STATE_DICT_TYPES = frozenset({"SHARDED_STATE_DICT", "LOCAL_STATE_DICT"})
LEGACY_SUMMON = f"{LEGACY_FSDP}.summon_full_params"
# FSDP2's mixed precision: the dtype of the unsharded parameters (forward/backward) and of the gradient reduction.
MIXED_PRECISION_POLICY = f"{DIST}.fsdp.MixedPrecisionPolicy"
# Whole-state gathers of a sharded model: collectives, whatever rank writes the result.
STATE_DICT_GATHERS = frozenset(
    f"{DIST}.checkpoint.state_dict.{name}" for name in ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict")
)
# Per-node duties: downloads and extractions into a node's disk, done by local rank 0 of each node.
DOWNLOADERS = frozenset({
    "torchvision.datasets.utils.download_url", "torchvision.datasets.utils.download_and_extract_archive",
    "torch.hub.download_url_to_file", "huggingface_hub.snapshot_download", "huggingface_hub.hf_hub_download",
    "datasets.load_dataset",
})
DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
SYNC_BATCHNORM_CONVERT = "torch.nn.SyncBatchNorm.convert_sync_batchnorm"
SPAWN_CALLS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
SEED_CALLS = frozenset({
    "torch.manual_seed", "torch.random.manual_seed", "lightning.seed_everything", "pytorch_lightning.seed_everything",
    "lightning.pytorch.seed_everything", "transformers.set_seed", "accelerate.utils.set_seed",
})
RANDOM_SPLIT = "torch.utils.data.random_split"

_RANK_NAME = re.compile(r"^(?:\w+_)?rank(?:_id)?$|^(?:gpu|gpu_id|local_gpu)$", re.IGNORECASE)
_MAIN_PROCESS_NAME = re.compile(
    r"^_?(?:is_)?(?:local_)?(?:main|master|primary|chief|rank_?0|rank_?zero|global_zero)"
    r"(?:_process|_proc|_rank|_node|_worker)?$",
    re.IGNORECASE,
)
_RANK_FUNCTIONS = frozenset({f"{DIST}.get_rank", f"{DIST}.get_node_local_rank", f"{DIST}.get_global_rank"})
_MAX_DEPTH = 12


# ----- assignments and the value that reaches a use ------------------------------------------
@per_anatomy
def assignments(a: Anatomy) -> dict[Ref, list[tuple[ast.stmt, ast.AST]]]:
    """Every `ref = value` (and `a, b = x, y`), in source order."""
    return {ref: [(b.stmt, b.value) for b in found if b.assigned] for ref, found in bindings(a).items()}  # type: ignore[misc]


def reaching_values(a: Anatomy, expr: ast.AST) -> list[ast.AST]:
    """The values that may reach this read of a variable.

    Within one function, the last assignment before the read; a parameter with no assignment
    before the read is every caller's argument; `self.x` read in another method (or a global read
    in a function) may hold any value assigned to it.
    """
    ref = a.ref(expr)
    if ref is None:
        return []
    use_scope = a.scope_of.get(expr, MODULE_SCOPE)
    here = a.stmt_of.get(expr)
    entries = [(s, v) for s, v in assignments(a).get(ref, ()) if s is not here]
    same_scope = [(s, v) for s, v in entries if a.scope_of.get(s, MODULE_SCOPE) == use_scope]
    before = [v for s, v in same_scope if s.lineno <= expr.lineno]
    if before:
        return [before[-1]]
    fn = a.functions.get(use_scope)
    if ref.scope == use_scope and fn is not None and ref.name in fn.params:
        index = fn.params.index(ref.name)
        return [arg for call in callers(a, use_scope) if (arg := argument(call, index, ref.name)) is not None]
    if ref.scope != use_scope:
        others = [v for s, v in entries if a.scope_of.get(s, MODULE_SCOPE) != use_scope and not _only_called_before(a, use_scope, s)]
        return others or [v for _, v in same_scope]
    return []


def is_iterable_dataset(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """Does `expr` hold an IterableDataset (no sampler can shard it: it yields its own samples)?"""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(expr, ast.NamedExpr):
        return is_iterable_dataset(a, expr.value, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return any(is_iterable_dataset(a, v, depth + 1) for v in reaching_values(a, expr))
    return isinstance(expr, ast.Call) and _derives_from_iterable_dataset(a, a.qualname(expr.func) or "", frozenset())


def _derives_from_iterable_dataset(a: Anatomy, name: str, seen: frozenset[str]) -> bool:
    if name in ITERABLE_DATASETS:
        return True
    cls = next((n for n in a.tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None or name in seen:
        return False
    return any(_derives_from_iterable_dataset(a, a.qualname(base) or "", seen | {name}) for base in cls.bases)


def _only_called_before(a: Anatomy, scope: str, stmt: ast.stmt) -> bool:
    """Is function `scope` called only from `stmt`'s function, before `stmt` (so `stmt` can't reach it)?"""
    calls = callers(a, scope)
    stmt_scope = a.scope_of.get(stmt, MODULE_SCOPE)
    return bool(calls) and all(a.scope_of.get(c) == stmt_scope and c.lineno < stmt.lineno for c in calls)


@per_anatomy
def _callers_by_scope(a: Anatomy) -> dict[str, list[ast.Call]]:
    """Local functions and methods, each with the calls that invoke it.

    Besides `Anatomy.callee` (plain names and `self.method()`), `obj.method()` counts as a call of
    every method of that name that a class of this file defines (`trainer.fit()`).
    """
    methods: dict[str, list[str]] = defaultdict(list)
    for scope, fn in a.functions.items():
        if fn.cls is not None:
            methods[fn.node.name].append(scope)
    found: dict[str, list[ast.Call]] = defaultdict(list)
    for site in a.calls:
        call: ast.Call = site.node  # type: ignore[assignment]
        callee = a.callee(call)
        if callee is not None:
            found[callee].append(call)
        elif isinstance(call.func, ast.Attribute) and not _is_self(call.func.value):
            for scope in methods.get(call.func.attr, ()):
                found[scope].append(call)
    return found


def callers(a: Anatomy, scope: str) -> list[ast.Call]:
    return _callers_by_scope(a).get(scope, [])


def calls_running(a: Anatomy, scope: str) -> list[ast.Call]:
    """Every call that runs function `scope`: its callers, their callers, and so on."""
    found: list[ast.Call] = []
    seen, todo = set(), [scope]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for call in callers(a, current):
            found.append(call)
            todo.append(enclosing_function(a, call))
    return found


def _is_self(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


def returned_values(a: Anatomy, scope: str) -> list[ast.AST]:
    fn = a.functions.get(scope)
    if fn is None:
        return []
    return [n.value for n in _walk_function(fn.node) if isinstance(n, ast.Return) and n.value is not None]


def _walk_function(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body, not descending into nested functions or classes."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))


# ----- ranks ---------------------------------------------------------------------------------
def is_rank_value(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """`rank`, `args.local_rank`, `self.gpu_id`, `dist.get_rank()`, a spawn worker's first parameter."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(expr, ast.Call):
        if a.qualname(expr.func) in _RANK_FUNCTIONS:
            return True
        name = identifier(expr.func)
        if name in ("get_rank", "get_local_rank", "get_global_rank"):
            return True
        if name == "int" and expr.args:
            return is_rank_value(a, expr.args[0], depth + 1)
        return False
    if isinstance(expr, ast.BinOp):  # args.rank % ngpus_per_node
        return is_rank_value(a, expr.left, depth + 1) or is_rank_value(a, expr.right, depth + 1)
    if isinstance(expr, ast.Subscript):  # os.environ["LOCAL_RANK"]
        key = expr.slice
        return isinstance(key, ast.Constant) and key.value in ("RANK", "LOCAL_RANK")
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
    if depth > _MAX_DEPTH:
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
        callee = a.callee(expr)
        return callee is not None and callee in _rank_test_functions(a)
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


@per_anatomy
def _rank_test_functions(a: Anatomy) -> set[str]:
    """Local functions that return a rank test (`def is_main(): return dist.get_rank() == 0`)."""
    return {scope for scope in a.functions if any(is_rank_test(a, v) for v in returned_values(a, scope))}


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


def rank_guarded(a: Anatomy, node: ast.AST, _seen: frozenset[str] = frozenset()) -> bool:
    """Does `node` run on some ranks only: under a rank test, after a rank exit, or in a function
    that is only ever called from such places?"""
    if any(is_rank_test(a, test) for test in conditions_on(a, node)):
        return True
    scope = enclosing_function(a, node)
    if scope == MODULE_SCOPE or scope in _seen:
        return False
    calls = callers(a, scope)
    return bool(calls) and all(rank_guarded(a, c, _seen | {scope}) for c in calls)


# ----- which code runs on every rank ---------------------------------------------------------
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
    for scope, calls in _callers_by_scope(a).items():
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


# ----- rank-0 duties -------------------------------------------------------------------------
def log_level(a: Anatomy, call: ast.AST) -> str | None:
    """The level of a log call (`logging.info(...)`, `logger.warning(...)`, `logging.getLogger().log(...)`)."""
    method = method_name(call)
    if method not in LOG_METHODS:
        return None
    func = call.func  # type: ignore[attr-defined]
    return method if (a.qualname(func) or "").startswith("logging.") or a.has_role(func.value, ROLE_LOGGER) else None


# ----- collectives ---------------------------------------------------------------------------
@per_anatomy
def collectives(a: Anatomy) -> list[CallSite]:
    return [c for c in a.calls if c.qualname in COLLECTIVES]


def calls_collective(a: Anatomy, body: Iterable[ast.AST]) -> bool:
    """Does this code (or a local function it calls) run a collective?"""
    return a.body_contains(body, lambda n: isinstance(n, ast.Call) and a.qualname(n.func) in COLLECTIVES)


# ----- work every rank must join ------------------------------------------------------------
def joins_every_rank(a: Anatomy, body: Iterable[ast.AST]) -> bool:
    """Does this code (or a local function it calls) train or call a collective?"""
    return a.body_contains(body, lambda n: _trains_or_syncs(a, n))


def _trains_or_syncs(a: Anatomy, node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    return a.is_training_call(node) or a.qualname(node.func) in COLLECTIVES or _runs_project_work(a, node)


def _runs_project_work(a: Anatomy, call: ast.Call) -> bool:
    """A call of another project file's function that may train, evaluate or join a collective."""
    exported = a.facts.imported.get(a.qualname(call.func) or "")
    return exported is not None and not exported.rank_zero_safe


def must_run_on_every_rank(a: Anatomy, call: ast.Call) -> bool:
    """Inside output that rank 0 alone will make (a print's f-string, a log's or a save's
    arguments): must this call run on every rank instead? Yes when it trains or calls a
    collective (itself, or through a function of this project), and when what it does is not
    known: a library's function, a method that is not a known read. No for pure formatting and
    reads (`vocabulary.is_pure_call`), output calls, this file's functions that join nothing,
    and calls on a model (rank-0 code calls the module inside the wrapper)."""
    if joins_by_itself(a, call) or runs_sharded_model(a, call):
        return True
    if is_pure_call(a, call) or is_output_call(a, call) or a.callee(call) is not None or calls_model(a, call):
        return False
    return a.qualname(call.func) not in a.facts.imported  # another file's function joins nothing: judged there


def may_do_work_off_rank_zero(a: Anatomy, scope: str) -> bool:
    """Could calling function `scope` on rank 0 alone leave the other ranks behind or waiting: does it
    (or what it calls) make a call that must run on every rank, or call a model, which another file
    can't unwrap? Another file's view of this file's function (`Exported.rank_zero_safe`)."""
    return a.function_contains(scope, lambda n: isinstance(n, ast.Call) and (must_run_on_every_rank(a, n) or calls_model(a, n)))


def is_output_call(a: Anatomy, call: ast.Call) -> bool:
    """`print(...)`, a log record, a TensorBoard writer's or a wandb run's call, a file opened or
    written: output, not work (opened on every rank, a file for writing would be truncated by each)."""
    func, qualname = call.func, a.qualname(call.func)
    if qualname == "print" or qualname in OPEN_CALLS or qualname in FILE_WRITE_CALLS or log_level(a, call) is not None:
        return True
    return isinstance(func, ast.Attribute) and (func.attr in FILE_WRITE_METHODS or a.has_role(func.value, ROLE_WRITER))


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


def hands_wrapper_to_work(a: Anatomy, call: ast.Call) -> bool:
    """`evaluate(model, loader)` with `model` the DDP wrapper: the callee may run the wrapper's
    forward, which broadcasts buffers to every rank. This file's function when it calls that
    parameter; another function unless it only formats, reads or writes output."""
    if is_pure_call(a, call) or is_output_call(a, call) or calls_model(a, call):
        return False
    callee = a.callee(call)
    if callee is None:
        return any(_is_wrapper_value(a, arg) for arg in (*call.args, *(k.value for k in call.keywords)))
    return any(_is_wrapper_value(a, argument(call, i, p)) and _calls_parameter(a, callee, p)
               for i, p in enumerate(a.functions[callee].params))


def _is_wrapper_value(a: Anatomy, expr: ast.AST | None) -> bool:
    return isinstance(expr, (ast.Name, ast.Attribute)) and is_wrapper(a, expr)


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


# ----- DDP wrappers --------------------------------------------------------------------------
@per_anatomy
def wrap_calls(a: Anatomy) -> list[CallSite]:
    """Every `DistributedDataParallel(model, ...)` call."""
    return a.calls_to(DDP_WRAPPER)


def wrapped_module(call: ast.Call) -> ast.AST | None:
    return argument(call, 0, "module")


def is_wrapper(a: Anatomy, expr: ast.AST, wrapper: str = DDP_WRAPPER, depth: int = 0) -> bool:
    """Does `expr` evaluate to a `wrapper` (DDP, or DataParallel), not the module inside it?"""
    def wrapped(named: ast.AST, at_depth: int) -> bool:
        if not a.has_role(named, ROLE_MODEL) or not _wrap_calls_of(a, wrapper):
            return False
        return any(is_wrapper(a, v, wrapper, at_depth + 1) for v in reaching_values(a, named))

    return _evaluates_to(a, expr, wrapper, wrapped, depth)


def may_become_wrapper(a: Anatomy, expr: ast.AST, wrapper: str = DDP_WRAPPER) -> bool:
    """Before the wrap: could `expr` evaluate to a `wrapper` once the models are wrapped (does it hold a model)?"""
    return _evaluates_to(a, expr, wrapper, lambda named, _: a.has_role(named, ROLE_MODEL), 0)


def _evaluates_to(a: Anatomy, expr: ast.AST, wrapper: str, named: Callable[[ast.AST, int], bool], depth: int) -> bool:
    """Does `expr` evaluate to a `wrapper`, a variable or attribute judged by `named`? Seen through
    `torch.compile`, methods that return the module, helpers' returns and conditionals."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(expr, ast.Call):
        q = a.qualname(expr.func)
        if q == wrapper:
            return True
        if q == "torch.compile" and expr.args:
            return _evaluates_to(a, expr.args[0], wrapper, named, depth + 1)
        if method_name(expr) in MODULE_RETURNING_SELF:
            return _evaluates_to(a, expr.func.value, wrapper, named, depth + 1)  # type: ignore[attr-defined]
        callee = a.callee(expr)
        if callee is None or _unwrapping_function(a, callee):
            return False
        return any(_evaluates_to(a, v, wrapper, named, depth + 1) for v in returned_values(a, callee))
    if isinstance(expr, ast.IfExp):
        if _unwraps(expr):
            return False
        return _evaluates_to(a, expr.body, wrapper, named, depth + 1) or _evaluates_to(a, expr.orelse, wrapper, named, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return named(expr, depth)
    return False


def _wrap_calls_of(a: Anatomy, wrapper: str) -> list[CallSite]:
    return wrap_calls(a) if wrapper == DDP_WRAPPER else a.calls_to(wrapper)


def _unwrapping_function(a: Anatomy, function: str) -> bool:
    """A function that returns a wrapper's `.module` on some path (ddpify's `evaluation_module`):
    what it hands back is the plain model, or a value that was never wrapped."""
    return any(isinstance(v, ast.Attribute) and v.attr == "module" for v in returned_values(a, function))


def _unwraps(expr: ast.IfExp) -> bool:
    """`model.module if distributed else model`: the plain model on either branch."""
    for inner, other in ((expr.body, expr.orelse), (expr.orelse, expr.body)):
        if isinstance(inner, ast.Attribute) and inner.attr == "module" and ast.dump(inner.value) == ast.dump(other):
            return True
    return False


def model_origins(a: Anatomy, expr: ast.AST, depth: int = 0) -> set[ast.Call] | None:
    """The constructor calls (`Net()`) whose model `expr` holds, seen through DDP wrappers,
    `.to()` chains and variables; None when some value can't be traced."""
    if depth > _MAX_DEPTH:
        return None
    if isinstance(expr, ast.Call):
        q = a.qualname(expr.func) or ""
        if a.is_model_constructor(q):
            return {expr}
        if q in (DDP_WRAPPER, "torch.compile", SYNC_BATCHNORM_CONVERT) or q in FULLY_SHARD:
            inner = argument(expr, 0, "module")
            return model_origins(a, inner, depth + 1) if inner is not None else None
        if method_name(expr) in MODULE_RETURNING_SELF:
            return model_origins(a, expr.func.value, depth + 1)  # type: ignore[attr-defined]
        callee = a.callee(expr)
        return _union(a, returned_values(a, callee), depth) if callee else None
    if isinstance(expr, ast.IfExp):
        return _union(a, [expr.body, expr.orelse], depth)
    if isinstance(expr, ast.Attribute) and expr.attr == "module":
        return model_origins(a, expr.value, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return _union(a, reaching_values(a, expr), depth)
    return None


def _union(a: Anatomy, exprs: list[ast.AST], depth: int) -> set[ast.Call] | None:
    if not exprs:
        return None
    found: set[ast.Call] = set()
    for e in exprs:
        origins = model_origins(a, e, depth + 1)
        if origins is None:
            return None
        found |= origins
    return found


@per_anatomy
def wrapped_origins(a: Anatomy) -> set[ast.Call]:
    """The constructor calls of every model that some DDP wrapper wraps."""
    found: set[ast.Call] = set()
    for site in wrap_calls(a):
        inner = wrapped_module(site.node)  # type: ignore[arg-type]
        found |= (model_origins(a, inner) or set()) if inner is not None else set()
    return found


# ----- per-node duties ------------------------------------------------------------------------
@per_anatomy
def downloads(a: Anatomy) -> list[CallSite]:
    """Calls that fetch data onto the node's disk: `MNIST(root, download=True)`, `load_dataset(...)`."""
    return [c for c in a.calls if c.qualname in DOWNLOADERS or constant(getattr(keyword(c.node, "download"), "value", None), True)]  # type: ignore[arg-type]


# ----- FSDP ----------------------------------------------------------------------------------
@per_anatomy
def shard_calls(a: Anatomy) -> list[CallSite]:
    """Every `fully_shard(module, ...)` call (FSDP2)."""
    return [c for c in a.calls if c.qualname in FULLY_SHARD]


@per_anatomy
def sharded_origins(a: Anatomy) -> set[ast.Call]:
    """The constructor calls of every model that `fully_shard` shards (its root, not its blocks)."""
    found: set[ast.Call] = set()
    for site in shard_calls(a):
        inner = argument(site.node, 0, "module")  # type: ignore[arg-type]
        found |= (model_origins(a, inner) or set()) if inner is not None else set()
    return found


def after_shard(a: Anatomy, node: ast.AST) -> bool:
    """Is `node` reached only once the model is sharded (later in the shard's function, or in a
    function that is not only called before the shard)?"""
    scope = a.scope_of.get(node, MODULE_SCOPE)
    for shard in shard_calls(a):
        if shard.scope == scope:
            return node.lineno > shard.stmt.end_lineno  # type: ignore[attr-defined, operator]
        if not _only_called_before(a, scope, shard.stmt):
            return True
    return False


def is_legacy_fsdp(a: Anatomy, expr: ast.AST) -> bool:
    """Does `expr` hold a legacy `FullyShardedDataParallel(...)` wrapper?"""
    values = reaching_values(a, expr) if isinstance(expr, (ast.Name, ast.Attribute)) else [expr]
    return any(isinstance(v, ast.Call) and a.qualname(v.func) == LEGACY_FSDP for v in values)


@per_anatomy
def sharded_legacy_state_dicts(a: Anatomy) -> list[CallSite]:
    """`FSDP.state_dict_type(...)` / `FSDP.set_state_dict_type(...)` calls that pick a per-rank mode."""
    return [
        c for c in a.calls
        if c.qualname in LEGACY_STATE_DICT_MODES
        and any(isinstance(n, ast.Attribute) and n.attr in SHARDED_STATE_DICT_TYPES for n in ast.walk(c.node))
    ]


def in_sharded_legacy_mode(a: Anatomy, node: ast.AST) -> bool:
    """Does `node` run where legacy FSDP's `state_dict()` returns this rank's shards: inside a
    `with FSDP.state_dict_type(m, StateDictType.SHARDED_STATE_DICT)` block, or after a
    `set_state_dict_type` to such a mode in the same function?"""
    modes = sharded_legacy_state_dicts(a)
    for block in a.enclosing(node, (ast.With, ast.AsyncWith)):
        if any(item.context_expr is mode.node for item in block.items for mode in modes):  # type: ignore[attr-defined]
            return True
    scope = a.scope_of.get(node, MODULE_SCOPE)
    return any(
        mode.scope == scope and isinstance(mode.stmt, ast.Expr) and mode.stmt.end_lineno < node.lineno  # type: ignore[attr-defined, operator]
        for mode in modes
    )


def is_sharded_model(a: Anatomy, expr: ast.AST) -> bool:
    """Does `expr` hold a model that `fully_shard` shards somewhere in the script?"""
    return bool(sharded_origins(a) and (model_origins(a, expr) or set()) & sharded_origins(a))


@per_anatomy
def uses_no_sync(a: Anatomy) -> bool:
    """Does the script skip gradient sync anywhere (`model.no_sync()`, `require_backward_grad_sync`)?"""
    return any(
        isinstance(n, ast.Attribute) and n.attr in ("no_sync", "require_backward_grad_sync") for n in a.nodes
    )


# ----- samplers ------------------------------------------------------------------------------
def loader_sampler(a: Anatomy, loader: LoaderSite) -> ast.Call | None:
    """The call that shards a DataLoader across ranks: the `DistributedSampler(...)` its
    `sampler=`/`batch_sampler=` holds, or a local function returning this rank's indices."""
    for name in ("sampler", "batch_sampler"):
        kw = keyword(loader.call, name)
        if kw is not None:
            return _distributed_sampler_in(a, kw.value, 0)
    return None


def _distributed_sampler_in(a: Anatomy, expr: ast.AST, depth: int) -> ast.Call | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(expr, ast.Call):
        if a.qualname(expr.func) == DISTRIBUTED_SAMPLER or _returns_rank_shard(a, expr):
            return expr
        inner = [_distributed_sampler_in(a, arg, depth + 1) for arg in (*expr.args, *(k.value for k in expr.keywords))]
        return next((s for s in inner if s is not None), None)  # BatchSampler(DistributedSampler(...), ...)
    if isinstance(expr, ast.IfExp):
        return _distributed_sampler_in(a, expr.body, depth + 1) or _distributed_sampler_in(a, expr.orelse, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        ref = a.ref(expr)
        for _, value in assignments(a).get(ref, ()) if ref else ():
            found = _distributed_sampler_in(a, value, depth + 1)
            if found is not None:
                return found
    return None


def _returns_rank_shard(a: Anatomy, call: ast.Call) -> bool:
    """A call of a local function whose result depends on the rank (ddpify's `evaluation_shard`)."""
    callee = a.callee(call)
    return callee is not None and any(mentions_rank(a, value) for value in returned_values(a, callee))


def sampler_shuffles(call: ast.Call) -> bool:
    return not constant(argument(call, 3, "shuffle"), False)


def has_sampler_argument(loader: LoaderSite) -> bool:
    return any(
        kw.arg in ("sampler", "batch_sampler") and not constant(kw.value, None) for kw in loader.call.keywords
    ) or len(loader.call.args) > 3


def bound_name(a: Anatomy, value: ast.AST) -> ast.AST | None:
    """The variable (`sampler`, `self.sampler`) an assignment binds `value` (or an IfExp holding it) to."""
    node = value
    while isinstance(a.parents.get(node), ast.IfExp):
        node = a.parents[node]
    stmt = a.parents.get(node)
    if isinstance(stmt, ast.Assign) and stmt.value is node and len(stmt.targets) == 1:
        return stmt.targets[0]
    if isinstance(stmt, ast.AnnAssign) and stmt.value is node:
        return stmt.target
    return None


def sets_epoch(a: Anatomy, body: Iterable[ast.AST]) -> bool:
    """Does this code (or a function it calls) call `<something>.set_epoch(...)`?"""
    return a.body_contains(body, lambda n: method_name(n) == "set_epoch")


# ----- seeding, environment, arguments, backend ----------------------------------------------
@per_anatomy
def seed_calls(a: Anatomy) -> list[CallSite]:
    """`torch.manual_seed(...)`, `seed_everything(...)`, or a call of a local function that seeds."""

    def seeds(n: ast.AST) -> bool:
        return isinstance(n, ast.Call) and a.qualname(n.func) in SEED_CALLS

    return [c for c in a.calls if c.qualname in SEED_CALLS or ((s := a.callee(c.node)) and a.function_contains(s, seeds))]  # type: ignore[arg-type]


def draws_alike_on_every_rank(a: Anatomy) -> list[ast.Call]:
    """Draws from torch's global RNG in a training step loop's own code or in a method of this file's
    models (a VAE's or a diffusion model's noise in forward; not a Dataset's) when the script seeds
    that RNG with no rank, outside the step loops: each rank draws the same values there."""
    seeds = seed_calls(a)
    steps = [loop.node for loop in a.step_loops if loop.trains]
    if not seeds or not steps or any(mentions_rank(a, seed.node) or _inside_any(a, seed.node, steps) for seed in seeds):
        return []
    methods = [fn for model in a.model_classes.values() for fn in model.node.body if isinstance(fn, ast.FunctionDef) and fn.name != "__init__"]
    bodies = [step.body for step in steps] + [fn.body for fn in methods]
    return list(dict.fromkeys(n for body in bodies for n in walk_body(body) if _draws_from_global_rng(a, n)))  # type: ignore[attr-defined]


def _inside_any(a: Anatomy, node: ast.AST, roots: list[ast.AST]) -> bool:
    return any(parent in roots for parent, _ in ancestors(a, node))


def _draws_from_global_rng(a: Anatomy, node: ast.AST) -> bool:
    """`torch.randn(...)`, `torch.rand_like(x)`, `noise.normal_(0, 1)`, with no `generator=` of their own."""
    if not isinstance(node, ast.Call) or keyword(node, "generator") is not None:
        return False
    module, _, name = (a.qualname(node.func) or "").rpartition(".")
    return (module == "torch" and name in RANDOM_DRAWS) or method_name(node) in RANDOM_FILLS


def unseeded_random_splits(a: Anatomy) -> list[CallSite]:
    """`random_split(...)` calls with no generator and no seed set before them: in a process per GPU,
    each process draws its own split (one rank's validation samples are another's training samples)."""
    return [
        c for c in a.calls_to(RANDOM_SPLIT)
        if len(c.node.args) < 3 and all(kw.arg not in ("generator", None) for kw in c.node.keywords)  # type: ignore[attr-defined]
        and not _seeded_before(a, c.node)
    ]


def _seeded_before(a: Anatomy, node: ast.AST) -> bool:
    """Is a seed set before `node` runs (earlier in its function, or in another function)?"""
    scope = enclosing_function(a, node)
    return any(
        enclosing_function(a, seed.node) != scope or seed.line < node.lineno  # type: ignore[attr-defined]
        for seed in seed_calls(a)
    )


def env_writes(a: Anatomy, variable: str) -> list[ast.AST]:
    """`os.environ[VAR] = ...`, `os.environ.setdefault(VAR, ...)`, `os.environ.update(VAR=...)`, `os.putenv(VAR, ...)`."""
    found: list[ast.AST] = []
    for node in a.nodes:
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if a.qualname(node.value) == "os.environ" and constant(node.slice, variable):
                found.append(node)
        elif isinstance(node, ast.Call):
            q = a.qualname(node.func)
            if q in ("os.environ.setdefault", "os.putenv", "os.environ.__setitem__") and node.args and constant(node.args[0], variable):
                found.append(node)
            elif q == "os.environ.update" and _names_variable(node, variable):
                found.append(node)
    return found


def _names_variable(call: ast.Call, variable: str) -> bool:
    if any(kw.arg == variable for kw in call.keywords):
        return True
    return any(isinstance(arg, ast.Dict) and any(constant(k, variable) for k in arg.keys) for arg in call.args)


@per_anatomy
def local_rank_arguments(a: Anatomy) -> list[CallSite]:
    """`parser.add_argument("--local_rank", ...)` (the torch.distributed.launch convention)."""
    return [
        c for c in a.calls
        if method_name(c.node) == "add_argument"
        and any(constant(arg, "--local_rank", "--local-rank") for arg in c.node.args)  # type: ignore[attr-defined]
    ]


def backends(a: Anatomy) -> list[tuple[CallSite, ast.AST | None]]:
    """Each `init_process_group(...)` call with its backend expression (None: the default)."""
    return [(c, argument(c.node, 0, "backend")) for c in a.calls_to(f"{DIST}.init_process_group")]  # type: ignore[arg-type]


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


# ----- GPU indices ---------------------------------------------------------------------------
def holds_integer(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """Is `expr` an int literal, or a variable only ever given one (`gpu = 0`, `self.gpu_id`
    set from a caller's `0`, `args.gpu` from an `add_argument(..., type=int)` option)?"""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(expr, ast.Constant):
        return type(expr.value) is int
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.attr in _integer_options(a):
        return True
    if isinstance(expr, (ast.Name, ast.Attribute)):
        values = reaching_values(a, expr)
        return bool(values) and all(holds_integer(a, v, depth + 1) for v in values)
    return False


@per_anatomy
def _integer_options(a: Anatomy) -> set[str]:
    """The `args.<dest>` names of argparse options declared `type=int` or with an int default."""
    found = set()
    for c in a.calls:
        call: ast.Call = c.node  # type: ignore[assignment]
        if method_name(call) != "add_argument" or not call.args or not isinstance(call.args[0], ast.Constant):
            continue
        kind, default = keyword(call, "type"), keyword(call, "default")
        if (kind is not None and isinstance(kind.value, ast.Name) and kind.value.id == "int") or (
            default is not None and constant(default.value, *range(-1, 16))
        ):
            dest = keyword(call, "dest")
            name = dest.value.value if dest is not None and isinstance(dest.value, ast.Constant) else str(call.args[0].value)
            found.add(name.lstrip("-").replace("-", "_"))
    return found
