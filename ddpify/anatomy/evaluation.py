"""Evaluation loops and the sums they accumulate; prints of the training loss.

An evaluation loop can be split across ranks exactly when everything it hands to the code after it
is a sum started from zero just before it (`correct += ...`, `loss_sum += ...`, `cm[t, p] += 1`) or
a list it appends to (`preds.append(...)`): summing (or joining, in rank order) those over the
ranks gives back what one process computes over the whole set.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.values import ROLE_LOADER, ROLE_MODEL
from ddpify.anatomy.vocabulary import ITERATION_WRAPPERS, PRINT
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.wrappers import unwrapping_function
from ddpify.anatomy.syntax import ancestors
from ddpify.anatomy.sites import LoaderSite, LoopSite

NO_GRAD_CONTEXTS = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad"})
ZERO_TENSOR_FACTORIES = frozenset({"torch.zeros", "torch.zeros_like", "torch.tensor"})
SUM = "sum"
LIST = "list"
_LIST_METHODS = frozenset({"append", "extend"})


@dataclass(eq=False)
class EvaluationLoop:
    """A step loop that does not train; `problem` says why it can't run on a shard (None: it can).
    Its accumulators, zeroed before the loop and read after it, in the order it first writes them:
    the variables it sums into, and the lists it appends to."""

    loop: LoopSite
    loaders: set[LoaderSite]
    summed: list[str] = field(default_factory=list)
    gathered: list[str] = field(default_factory=list)
    problem: str | None = None


@dataclass(frozen=True)
class ModelRead:
    """A read of a model in an evaluation loop: `node` is replaced by the module's name, `model` (the
    wrapper's expression, `model` or `self.model`) is what the module is taken from."""

    node: ast.expr
    model: ast.expr


@dataclass(eq=False)
class LossPrint:
    """A `print` in a training step loop showing the loss (or a running sum of it): `names` to average."""

    stmt: ast.stmt
    names: list[str]


# ----- evaluation loops ----------------------------------------------------------------------
@per_anatomy
def evaluation_loops(a: Anatomy) -> list[EvaluationLoop]:
    """Every step loop that does not train, with its accumulators or the reason it can't be sharded."""
    found = []
    for loop in a.step_loops:
        if loop.trains:
            continue
        loaders = iterated_loaders(a, loop.node.iter)  # type: ignore[attr-defined]
        evaluation = EvaluationLoop(loop, loaders)
        evaluation.problem = _loop_problem(a, evaluation)
        found.append(evaluation)
    return found


@per_anatomy
def shardable(a: Anatomy) -> tuple[list[LoaderSite], list[EvaluationLoop]]:
    """The evaluation loaders to shard and the loops to reduce: a loader is sharded only when every
    loop over it can be reduced, and a loop is reduced only when every loader it iterates is sharded."""
    loops = [e for e in evaluation_loops(a) if e.problem is None]
    while True:
        loaders = {ld for e in loops for ld in e.loaders}
        loaders -= {ld for e in evaluation_loops(a) if e.problem is not None for ld in e.loaders}
        kept = [e for e in loops if e.loaders <= loaders]
        if len(kept) == len(loops):
            return sorted(loaders, key=lambda ld: ld.line), loops
        loops = kept


def iterated_loaders(a: Anatomy, expr: ast.AST) -> set[LoaderSite]:
    """Every DataLoader a `for` loop's iterable can hold (through enumerate/tqdm/zip and arguments)."""
    while isinstance(expr, ast.Call) and a.qualname(expr.func) in ITERATION_WRAPPERS and expr.args:
        expr = expr.args[0]
    return a.origins(expr, ROLE_LOADER)  # type: ignore[return-value]


def loader_problem(loader: LoaderSite) -> str | None:
    """Why this DataLoader can't take an evaluation shard as its sampler (None: it can)."""
    call = loader.call
    if call is None:
        return "it is built in another file of the project"
    keywords = {kw.arg: kw.value for kw in call.keywords}
    if None in keywords:
        return "its options come from a ** dict"
    if "sampler" in keywords or "batch_sampler" in keywords or len(call.args) > 1:
        return "it has its own sampler or positional options"
    if not _is_false(keywords.get("shuffle")):
        return "it shuffles"
    if _is_none(keywords.get("batch_size")) and "batch_size" in keywords:
        return "it has no batch size"
    if not call.args and "dataset" not in keywords:
        return "its dataset is not named"
    return None


def batch_size_code(loader: LoaderSite) -> str:
    batch_size = next((kw.value for kw in loader.call.keywords if kw.arg == "batch_size"), None)
    return ast.unparse(batch_size) if batch_size is not None else "1"


def _loop_problem(a: Anatomy, evaluation: EvaluationLoop) -> str | None:
    loop = evaluation.loop.node
    if not evaluation.loaders or any(ld.is_train for ld in evaluation.loaders):
        return "it also iterates a training loader"
    for loader in evaluation.loaders:
        problem = loader_problem(loader)
        if problem:
            return f"the loader can't be sharded: {problem}"
    if any(isinstance(n, (ast.Break, ast.Return, ast.Yield, ast.YieldFrom)) for n in _own_nodes(loop)):
        return "it can leave the loop early"
    if not runs_without_grad(a, loop):
        return "it runs with gradients on (wrap it in torch.no_grad())"
    hidden = _forward_out_of_sight(a, loop)
    if hidden:
        return f"`{hidden}` calls the model out of the loop's sight (ranks run unequal numbers of batches, and a wrapper's forward is a collective)"
    after = statements_after(a, loop)
    if _reads_loader(a, evaluation.loaders, after):
        return "the loader is read after the loop (len(loader)?)"
    problem = _find_accumulators(a, evaluation, after)
    if problem:
        return problem
    return None if evaluation.summed or evaluation.gathered else "it computes nothing the codemod can sum over ranks"


def model_reads(a: Anatomy, evaluation: EvaluationLoop) -> list[ModelRead]:
    """The reads of a model in the loop's body, outermost first (`model`, `self.model`, and
    `model.module` as one read of `model`)."""
    found, stack = [], list(_body(evaluation.loop.node))
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) and _holds_model(a, node):
            found.append(_model_read(a, node))
            continue
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES))
    return sorted(found, key=lambda r: (r.node.lineno, r.node.col_offset))


def _model_read(a: Anatomy, node: ast.expr) -> ModelRead:
    """`model` read as itself, or inside `model.module` or `plain_model(model)` (which the read then replaces)."""
    if isinstance(node, ast.Attribute) and node.attr == "module" and _holds_model(a, node.value):
        return ModelRead(node, node.value)
    parent = a.parents.get(node)
    if isinstance(parent, ast.Attribute) and parent.attr == "module" or _unwrapping_call(a, parent, node):
        return ModelRead(parent, node)  # type: ignore[arg-type]
    return ModelRead(node, node)


def _unwrapping_call(a: Anatomy, call: ast.AST | None, model: ast.expr) -> bool:
    """`plain_model(model)`: a call of a function that unwraps the model it is handed, the model alone."""
    if not isinstance(call, ast.Call) or call.args != [model] or call.keywords:
        return False
    callee = a.callee(call)
    return callee is not None and unwrapping_function(a, callee)


def _holds_model(a: Anatomy, node: ast.AST) -> bool:
    return a.has_role(node, ROLE_MODEL)


def _forward_out_of_sight(a: Anatomy, loop: ast.For) -> str | None:
    """The first function the loop calls that reads a model it was not handed (a global, `self.model`):
    its forward can't be routed around the wrapper from the loop."""
    for node in _own_nodes(loop):
        callee = a.callee(node) if isinstance(node, ast.Call) else None
        function = a.functions.get(callee) if callee else None
        if function is not None and _reads_model_not_handed_in(a, function.node):
            return ast.unparse(node.func)  # type: ignore[attr-defined]
    return None


def _reads_model_not_handed_in(a: Anatomy, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    handed = {arg.arg for arg in ast.walk(function.args) if isinstance(arg, ast.arg)} - {"self"}
    return any(
        isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and _holds_model(a, n)
        and not (isinstance(n, ast.Name) and n.id in handed)
        for n in ast.walk(function)
    )


def runs_without_grad(a: Anatomy, node: ast.AST) -> bool:
    """Is `node` inside `with torch.no_grad():` (or inference_mode), or a function decorated so?"""
    for parent, _ in ancestors(a, node):
        if isinstance(parent, (ast.With, ast.AsyncWith)) and any(_is_no_grad(a, i.context_expr) for i in parent.items):
            return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return any(_is_no_grad(a, d) for d in parent.decorator_list)
    return False


def _is_no_grad(a: Anatomy, expr: ast.AST) -> bool:
    func = expr.func if isinstance(expr, ast.Call) else expr
    return a.qualname(func) in NO_GRAD_CONTEXTS


def _find_accumulators(a: Anatomy, evaluation: EvaluationLoop, after: list[ast.stmt]) -> str | None:
    """The variables written in the loop and read after it (into `evaluation`): each must be a sum or
    a list from zero; else why not."""
    loop = evaluation.loop.node
    read_after = {n.id for stmt in after for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for name in sorted(_written_names(loop) & read_after, key=lambda n: _first_write(loop, n)):
        kind = _accumulation_kind(a, loop, name)
        if kind is None:
            evaluation.summed, evaluation.gathered = [], []
            return f"`{name}` is computed in the loop and read after it, but is not a sum or list started from zero before it"
        (evaluation.summed if kind == SUM else evaluation.gathered).append(name)
    return None


def _first_write(loop: ast.For, name: str) -> tuple[int, int]:
    return min((n.lineno, n.col_offset) for n in _own_nodes(loop) if _writes(n, name))


def _written_names(loop: ast.For) -> set[str]:
    """Names the loop body binds or mutates (`x = ...`, `x += ...`, `x[i] += ...`, `x.append(...)`)."""
    names = set()
    for node in _own_nodes(loop):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript):
            names.add(ast.unparse(node.target.value))
        elif _list_update(node) is not None:
            names.add(_list_update(node))  # type: ignore[arg-type]
    return names


def _accumulation_kind(a: Anatomy, loop: ast.For, name: str) -> str | None:
    """SUM or LIST when every write to `name` in the loop adds to it, and it is zeroed before the loop."""
    init = _reaching_init(a, loop, name)
    if init is None:
        return None
    kind = LIST if isinstance(init, (ast.List, ast.Call)) and _is_empty_list(a, init) else SUM if _is_zero(a, init) else None
    augmented = {id(n.target) for n in _own_nodes(loop) if isinstance(n, ast.AugAssign)}
    updates = [n for n in _own_nodes(loop) if _writes(n, name) and id(n) not in augmented]
    if kind is None or not updates or not all(_adds(n, name, kind) for n in updates):
        return None
    if _read_elsewhere_in_loop(loop, name, updates):
        return None
    return kind


def _writes(node: ast.AST, name: str) -> bool:
    """Does `node` bind or update `name` (`name = ...`, `name += ...`, `name[i] += ...`, `name.append(...)`)?"""
    if isinstance(node, ast.AugAssign):
        target = node.target.value if isinstance(node.target, ast.Subscript) else node.target
        return ast.unparse(target) == name
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.With, ast.NamedExpr, ast.comprehension)):
        return False  # their targets are visited as Name nodes
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return node.id == name
    return _list_update(node) == name


def _adds(node: ast.AST, name: str, kind: str) -> bool:
    """`name += ...` (SUM or LIST), `name[...] += ...` (SUM) or `name.append/extend(...)` (LIST)."""
    if isinstance(node, ast.Name):  # `name = ...` starts over
        return False
    if isinstance(node, ast.AugAssign):
        return isinstance(node.op, ast.Add) and (kind == SUM or isinstance(node.target, ast.Name))
    return kind == LIST


def _list_update(node: ast.AST) -> str | None:
    """`x` in the call `x.append(...)` / `x.extend(...)`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LIST_METHODS:
        if isinstance(node.func.value, ast.Name):
            return node.func.value.id
    return None


def _read_elsewhere_in_loop(loop: ast.For, name: str, updates: list[ast.AST]) -> bool:
    """Is the running value read in the loop other than by its own updates (a running print)?"""
    own = {id(n) for u in updates for n in ast.walk(u.target if isinstance(u, ast.AugAssign) else u.func.value)}  # type: ignore[attr-defined]
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and id(n) not in own for n in _own_nodes(loop))


def _reaching_init(a: Anatomy, loop: ast.For, name: str) -> ast.AST | None:
    """The value last bound to `name` before the loop, in a block that runs again every time the loop
    does (not outside an enclosing loop, which would carry an already reduced sum into the next pass)."""
    for parent, child in ancestors(a, loop):
        block = a.block_of(child) if isinstance(child, ast.stmt) else []
        for stmt in reversed(block[: block.index(child)] if child in block else []):
            value = _bound_value(stmt, name)
            if value is not None:
                return value
            if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(stmt)):
                return None  # bound some other way (inside an if, a loop, ...)
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
    return None


def _bound_value(stmt: ast.stmt, name: str) -> ast.AST | None:
    """The value `stmt` binds to `name` (`name = v`, `a, name = x, v`, `name: int = v`)."""
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
        return stmt.value
    if not isinstance(stmt, ast.Assign):
        return None
    for target in stmt.targets:
        if isinstance(target, ast.Name) and target.id == name:
            return stmt.value
        if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) and len(target.elts) == len(stmt.value.elts):
            for t, v in zip(target.elts, stmt.value.elts):
                if isinstance(t, ast.Name) and t.id == name:
                    return v
    return None


def _is_zero(a: Anatomy, value: ast.AST) -> bool:
    """`0`, `0.0`, `torch.zeros(...)`, `torch.zeros_like(...)`, `torch.tensor(0.0)`."""
    if isinstance(value, ast.Constant):
        return value.value == 0 and not isinstance(value.value, bool)
    if isinstance(value, ast.Call):
        func = value.func
        while isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and func.attr in ("to", "cuda", "cpu", "long", "float", "double"):
            func = func.value.func  # torch.zeros(n, n).to(device)
        call = func.value if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) else value
        q = a.qualname(call.func)  # type: ignore[attr-defined]
        if q == "torch.tensor":
            return bool(call.args) and isinstance(call.args[0], ast.Constant) and call.args[0].value == 0  # type: ignore[attr-defined]
        return q in ZERO_TENSOR_FACTORIES
    return False


def _is_empty_list(a: Anatomy, value: ast.AST) -> bool:
    if isinstance(value, ast.List):
        return not value.elts
    return isinstance(value, ast.Call) and a.qualname(value.func) == "list" and not value.args and not value.keywords  # type: ignore[attr-defined]


def _reads_loader(a: Anatomy, loaders: set[LoaderSite], after: list[ast.stmt]) -> bool:
    """Is a variable holding one of the loaders read after the loop (other than `loader.dataset`)?"""
    for stmt in after:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(getattr(node, "ctx", None), ast.Load):
                parent = a.parents.get(node)
                if isinstance(parent, ast.Attribute) and parent.attr == "dataset":
                    continue
                if a.origins(node, ROLE_LOADER) & loaders:
                    return True
    return False


def statements_after(a: Anatomy, stmt: ast.stmt) -> list[ast.stmt]:
    """The statements that run after `stmt` in its function: later siblings at every nesting level."""
    found: list[ast.stmt] = []
    for parent, child in [(None, stmt), *ancestors(a, stmt)]:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            break
        if isinstance(child, ast.stmt):
            block = a.block_of(child)
            found += block[block.index(child) + 1 :] if child in block else []
    return found


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _body(loop: ast.AST) -> list[ast.stmt]:
    return [*getattr(loop, "body", ()), *getattr(loop, "orelse", ())]


def _own_nodes(loop: ast.AST):
    """The nodes of a loop's body (not its iterable), not descending into nested functions."""
    stack = _body(loop)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES))


def _is_false(expr: ast.AST | None) -> bool:
    return expr is None or (isinstance(expr, ast.Constant) and expr.value is False)


def _is_none(expr: ast.AST | None) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is None


# ----- prints of the training loss -----------------------------------------------------------
@per_anatomy
def loss_prints(a: Anatomy) -> list[LossPrint]:
    """`print(...)` statements in training step loops that show the loss, where every rank reaches
    them at the same steps (only loop counters and values from outside the loop decide)."""
    found = []
    for loop in a.step_loops:
        if not loop.trains:
            continue
        losses = _loss_names(loop.node)
        for node in _own_nodes(loop.node):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and a.qualname(node.value.func) == PRINT:
                names = sorted({n.id for n in ast.walk(node.value) if isinstance(n, ast.Name) and n.id in losses})
                if names and _same_steps_on_every_rank(a, loop.node, node):
                    found.append(LossPrint(node, names))
    return found


def _loss_names(loop: ast.AST) -> set[str]:
    """`loss` in `loss.backward()`, and running sums of it (`running_loss += loss.item()`)."""
    nodes = list(_own_nodes(loop))
    losses = {
        n.func.value.id for n in nodes
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward" and isinstance(n.func.value, ast.Name)
    }
    running = {
        n.target.id for n in nodes
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and isinstance(n.op, ast.Add)
        and any(isinstance(m, ast.Name) and m.id in losses for m in ast.walk(n.value))
    }
    return losses | running


def _same_steps_on_every_rank(a: Anatomy, loop: ast.For, stmt: ast.stmt) -> bool:
    """Is `stmt` directly in the loop, or under `if`s that test only the loop's own counters and
    values bound outside the loop (`if step % 10 == 0:`)?"""
    counters = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    bound_inside = {n.id for n in _own_nodes(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - counters
    for parent, _ in ancestors(a, stmt):
        if parent is loop:
            return True
        if not isinstance(parent, ast.If) or any(isinstance(n, ast.Name) and n.id in bound_inside for n in ast.walk(parent.test)):
            return False
    return False

