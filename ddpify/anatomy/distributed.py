"""What a DDP script does across ranks, read from its `Anatomy` by the DDP lint rules.

Rank conditions (`if rank == 0:`, `if dist.get_rank() == 0`, `if is_main_process():`, early
`return`s under them), collectives, DDP wrappers and what they wrap, DistributedSamplers, seeding,
environment writes, `--local_rank` arguments and the process-group backend.

Every function takes an `Anatomy`; whole-script results are cached on it (`_cached`), so rules that
ask the same question share one answer. Values are followed the way `Anatomy.roles` follows them,
but where the analysis is flow-insensitive, the DDP questions are not: `model` is the plain model
before `model = DDP(model)` and the wrapper after it, so `wrapper_value` reads the assignment that
reaches the use.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from typing import Callable, Iterable, Iterator

from ddpify.anatomy.analyzer import DDP_WRAPPER, ROLE_MODEL, Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite, LoaderSite, Ref, ScriptKind

DIST = "torch.distributed"
COLLECTIVES = frozenset(
    f"{DIST}.{name}"
    for name in (
        "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_gather_coalesced",
        "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier",
        "broadcast", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
        "gather", "gather_object", "scatter", "scatter_object_list", "new_group",
    )
)
DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
SYNC_BATCHNORM_CONVERT = "torch.nn.SyncBatchNorm.convert_sync_batchnorm"
SPAWN_CALLS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
SEED_CALLS = frozenset({
    "torch.manual_seed", "torch.random.manual_seed", "lightning.seed_everything", "pytorch_lightning.seed_everything",
    "lightning.pytorch.seed_everything", "transformers.set_seed", "accelerate.utils.set_seed",
})
SAVE_CALLS = frozenset({"torch.save", "numpy.save", "numpy.savez", "numpy.savetxt"})

# Everything an `nn.Module` or a `DistributedDataParallel` instance answers itself (torch 2.x);
# any other attribute read on the wrapper raises AttributeError (it lives on `.module`).
MODULE_ATTRIBUTES = frozenset({
    "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile",
    "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr", "float", "forward", "get_buffer",
    "get_extra_state", "get_parameter", "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia",
    "named_buffers", "named_children", "named_modules", "named_parameters", "parameters",
    "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter", "register_state_dict_post_hook",
    "register_state_dict_pre_hook", "requires_grad_", "set_extra_state", "set_submodule", "share_memory",
    "state_dict", "to", "to_empty", "train", "training", "type", "xpu", "zero_grad",
})
DDP_ATTRIBUTES = frozenset({
    "broadcast_bucket_size", "broadcast_buffers", "bucket_bytes_cap", "device", "device_ids", "device_type",
    "dim", "find_unused_parameters", "gather", "gradient_as_bucket_view", "is_multi_device_module", "join",
    "join_device", "join_hook", "join_process_group", "logger", "mixed_precision", "module", "modules_buffers",
    "no_sync", "output_device", "parameters_to_ignore", "process_group", "reducer", "register_comm_hook",
    "require_backward_grad_sync", "require_forward_param_sync", "scatter", "static_graph", "to_kwargs",
    "will_sync_module_buffers",
})
WRAPPER_ATTRIBUTES = MODULE_ATTRIBUTES | DDP_ATTRIBUTES

_RANK_NAME = re.compile(r"^(?:\w+_)?rank(?:_id)?$|^(?:gpu|gpu_id|local_gpu)$", re.IGNORECASE)
_MAIN_PROCESS_NAME = re.compile(
    r"^_?(?:is_)?(?:local_)?(?:main|master|primary|chief|rank_?0|rank_?zero|global_zero)"
    r"(?:_process|_proc|_rank|_node|_worker)?$",
    re.IGNORECASE,
)
_RANK_FUNCTIONS = frozenset({f"{DIST}.get_rank", f"{DIST}.get_node_local_rank", f"{DIST}.get_global_rank"})
_WRAPPER_KEEPING_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "requires_grad_"})
_MAX_DEPTH = 12


def _cached(fn: Callable[[Anatomy], object]):
    """Cache a whole-script answer on the anatomy object itself."""

    @functools.wraps(fn)
    def wrapper(a: Anatomy):
        cache = a.__dict__.setdefault("_dist", {})
        if fn.__name__ not in cache:
            cache[fn.__name__] = fn(a)
        return cache[fn.__name__]

    return wrapper


# ----- small syntax helpers ------------------------------------------------------------------
def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((kw for kw in call.keywords if kw.arg == name), None)


def argument(call: ast.Call, index: int, name: str) -> ast.AST | None:
    """The argument passed by keyword `name` or at position `index`."""
    kw = keyword(call, name)
    if kw is not None:
        return kw.value
    return call.args[index] if index < len(call.args) and not isinstance(call.args[index], ast.Starred) else None


def constant(expr: ast.AST | None, *values: object) -> bool:
    """Is `expr` a literal equal to one of `values` (True is not 1 here)?"""
    return isinstance(expr, ast.Constant) and any(type(expr.value) is type(v) and expr.value == v for v in values)


def method_name(call: ast.AST) -> str | None:
    """`step` for `x.step(...)`."""
    return call.func.attr if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) else None


def identifier(expr: ast.AST) -> str | None:
    """The last name of `x`, `self.x`, `args.x`."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def spelling(a: Anatomy, qualified: str) -> str | None:
    """How this file spells `qualified` through its imports (`dist.barrier`), or None if it can't."""
    best: tuple[int, str] | None = None
    for local, target in a.names.aliases.items():
        if qualified == target or qualified.startswith(target + "."):
            candidate = local + qualified[len(target):]
            if best is None or len(target) > best[0]:
                best = (len(target), candidate)
    return best[1] if best else None


def ancestors(a: Anatomy, node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(parent, child-on-the-path) pairs from `node` up to the module."""
    child, parent = node, a.parents.get(node)
    while parent is not None:
        yield parent, child
        child, parent = parent, a.parents.get(parent)


def enclosing_function(a: Anatomy, node: ast.AST) -> str:
    """The scope name of the function (or the module) whose body holds `node`."""
    scope = a.scope_of.get(node, MODULE_SCOPE)
    while scope != MODULE_SCOPE and scope not in a.functions:
        scope = scope.rpartition(".")[0] or MODULE_SCOPE
    return scope


def contains(expr: ast.AST, predicate: Callable[[ast.AST], bool]) -> bool:
    return any(predicate(n) for n in ast.walk(expr))


# ----- assignments and the value that reaches a use ------------------------------------------
@_cached
def assignments(a: Anatomy) -> dict[Ref, list[tuple[ast.stmt, ast.AST]]]:
    """Every `ref = value` (and `a, b = x, y`), in source order."""
    found: dict[Ref, list[tuple[ast.stmt, ast.AST]]] = defaultdict(list)
    for node in ast.walk(a.tree):
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs = [(node.target, node.value)]
        else:
            continue
        for target, value in _unpack(pairs):
            ref = a.ref(target)
            if ref is not None:
                found[ref].append((node, value))
    for entries in found.values():
        entries.sort(key=lambda e: (e[0].lineno, e[0].col_offset))
    return found


def _unpack(pairs: list[tuple[ast.AST, ast.AST]]) -> Iterator[tuple[ast.AST, ast.AST]]:
    for target, value in pairs:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            yield from zip(target.elts, value.elts)
        else:
            yield target, value


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


def _only_called_before(a: Anatomy, scope: str, stmt: ast.stmt) -> bool:
    """Is function `scope` called only from `stmt`'s function, before `stmt` (so `stmt` can't reach it)?"""
    calls = callers(a, scope)
    stmt_scope = a.scope_of.get(stmt, MODULE_SCOPE)
    return bool(calls) and all(a.scope_of.get(c) == stmt_scope and c.lineno < stmt.lineno for c in calls)


@_cached
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


@_cached
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


@_cached
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
    `x if test else y`) around it, and those of earlier `if <test>: return` statements."""
    for parent, child in ancestors(a, node):
        if isinstance(child, ast.stmt):
            block = a.block_of(child)
            if child in block:
                yield from (s.test for s in block[: block.index(child)] if isinstance(s, ast.If) and exits(a, s.body))
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            yield parent.test


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
@_cached
def spawn_workers(a: Anatomy) -> set[str]:
    """Functions handed to `mp.spawn(fn, ...)`."""
    found = set()
    for site in a.calls_to(*SPAWN_CALLS):
        fn = argument(site.node, 0, "fn")  # type: ignore[arg-type]
        if isinstance(fn, ast.Name) and fn.id in a.functions:
            found.add(fn.id)
    return found


@_cached
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


# ----- collectives ---------------------------------------------------------------------------
@_cached
def collectives(a: Anatomy) -> list[CallSite]:
    return [c for c in a.calls if c.qualname in COLLECTIVES]


def calls_collective(a: Anatomy, body: Iterable[ast.AST]) -> bool:
    """Does this code (or a local function it calls) run a collective?"""
    return a.body_contains(body, lambda n: isinstance(n, ast.Call) and a.qualname(n.func) in COLLECTIVES)


# ----- DDP wrappers --------------------------------------------------------------------------
@_cached
def wrap_calls(a: Anatomy) -> list[CallSite]:
    """Every `DistributedDataParallel(model, ...)` call."""
    return a.calls_to(DDP_WRAPPER)


def wrapped_module(call: ast.Call) -> ast.AST | None:
    return argument(call, 0, "module")


def is_wrapper(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """Does `expr` evaluate to a DDP wrapper (not the module inside it)?"""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(expr, ast.Call):
        q = a.qualname(expr.func)
        if q == DDP_WRAPPER:
            return True
        if q == "torch.compile" and expr.args:
            return is_wrapper(a, expr.args[0], depth + 1)
        if method_name(expr) in _WRAPPER_KEEPING_METHODS:
            return is_wrapper(a, expr.func.value, depth + 1)  # type: ignore[attr-defined]
        callee = a.callee(expr)
        return callee is not None and any(is_wrapper(a, v, depth + 1) for v in returned_values(a, callee))
    if isinstance(expr, ast.IfExp):
        if _unwraps(expr):
            return False
        return is_wrapper(a, expr.body, depth + 1) or is_wrapper(a, expr.orelse, depth + 1)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        if not a.has_role(expr, ROLE_MODEL) or not wrap_calls(a):
            return False
        return any(is_wrapper(a, v, depth + 1) for v in reaching_values(a, expr))
    return False


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
        if q in (DDP_WRAPPER, "torch.compile", SYNC_BATCHNORM_CONVERT):
            inner = argument(expr, 0, "module")
            return model_origins(a, inner, depth + 1) if inner is not None else None
        if method_name(expr) in _WRAPPER_KEEPING_METHODS:
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


@_cached
def wrapped_origins(a: Anatomy) -> set[ast.Call]:
    """The constructor calls of every model that some DDP wrapper wraps."""
    found: set[ast.Call] = set()
    for site in wrap_calls(a):
        inner = wrapped_module(site.node)  # type: ignore[arg-type]
        found |= (model_origins(a, inner) or set()) if inner is not None else set()
    return found


@_cached
def uses_no_sync(a: Anatomy) -> bool:
    """Does the script skip gradient sync anywhere (`model.no_sync()`, `require_backward_grad_sync`)?"""
    return any(
        isinstance(n, ast.Attribute) and n.attr in ("no_sync", "require_backward_grad_sync") for n in ast.walk(a.tree)
    )


# ----- samplers ------------------------------------------------------------------------------
def loader_sampler(a: Anatomy, loader: LoaderSite) -> ast.Call | None:
    """The `DistributedSampler(...)` call a DataLoader's `sampler=`/`batch_sampler=` holds."""
    for name in ("sampler", "batch_sampler"):
        kw = keyword(loader.call, name)
        if kw is not None:
            return _distributed_sampler_in(a, kw.value, 0)
    return None


def _distributed_sampler_in(a: Anatomy, expr: ast.AST, depth: int) -> ast.Call | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(expr, ast.Call):
        if a.qualname(expr.func) == DISTRIBUTED_SAMPLER:
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
@_cached
def seed_calls(a: Anatomy) -> list[CallSite]:
    """`torch.manual_seed(...)`, `seed_everything(...)`, or a call of a local function that seeds."""

    def seeds(n: ast.AST) -> bool:
        return isinstance(n, ast.Call) and a.qualname(n.func) in SEED_CALLS

    return [c for c in a.calls if c.qualname in SEED_CALLS or ((s := a.callee(c.node)) and a.function_contains(s, seeds))]  # type: ignore[arg-type]


def env_writes(a: Anatomy, variable: str) -> list[ast.AST]:
    """`os.environ[VAR] = ...`, `os.environ.setdefault(VAR, ...)`, `os.environ.update(VAR=...)`, `os.putenv(VAR, ...)`."""
    found: list[ast.AST] = []
    for node in ast.walk(a.tree):
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


@_cached
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
