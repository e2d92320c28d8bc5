"""Find a training script's anatomy once, for the codemods and the lint rules alike.

The analysis runs on Python's `ast` (a C parser, ~30x faster than building a LibCST tree), and
every fact carries a LibCST-style position, so a codemod finds the CST node at the same place.
Values are followed through assignments, `self.attr`, function arguments and return values, so a
model built in `main()` and handed to `train_one_epoch(model, loader, ...)` is the same model there.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Iterator

from ddpify.anatomy.names import ImportTable
from ddpify.anatomy.sites import (
    MODULE_SCOPE,
    CallSite,
    LoaderSite,
    LoopSite,
    ModelSite,
    Pos,
    Ref,
    ScriptKind,
    Site,
)

ROLE_MODEL = "model"
ROLE_LOADER = "loader"
ROLE_OPTIMIZER = "optimizer"
ROLE_SCHEDULER = "scheduler"
ROLE_WRITER = "writer"
ROLE_LOGGER = "logger"
ROLE_PBAR = "pbar"
ROLE_SCALER = "scaler"
ROLE_CRITERION = "criterion"

LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log"})
_MODEL_KEEPING_METHODS = frozenset(
    {"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "requires_grad_", "module"}
)
_ITER_WRAPPERS = frozenset({"enumerate", "iter", "zip", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm"})
_TQDM = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm"})
_WRITERS = frozenset({"torch.utils.tensorboard.SummaryWriter", "tensorboardX.SummaryWriter", "wandb.init"})
_MODEL_FACTORIES = ("torchvision.models.", "timm.create_model", "transformers.")
_NOT_MODELS = frozenset({"torch.nn.Parameter", "torch.nn.ParameterList", "torch.nn.ParameterDict", "torch.nn.Module"})
DDP_WRAPPER = "torch.nn.parallel.DistributedDataParallel"
DP_WRAPPER = "torch.nn.parallel.DataParallel"
_BATCHNORM = re.compile(r"^torch\.nn\.(BatchNorm[123]d|LazyBatchNorm[123]d)$")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass
class ModelClass:
    """An `nn.Module` subclass defined in the script."""

    node: ast.ClassDef
    name: str
    methods: set[str] = field(default_factory=set)
    attributes: set[str] = field(default_factory=set)
    has_batchnorm: bool = False

    @property
    def forward(self) -> ast.FunctionDef | None:
        return next(
            (n for n in self.node.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None
        )


@dataclass
class Function:
    """A function or method defined in the script, with the scope name its body runs in."""

    node: ast.FunctionDef | ast.AsyncFunctionDef
    scope: str
    cls: str | None
    locals: set[str]

    @property
    def params(self) -> list[str]:
        args = self.node.args
        names = [a.arg for a in (*args.posonlyargs, *args.args)]
        return names[1:] if self.cls and names and names[0] in ("self", "cls") else names


class Anatomy:
    """Everything ddpify knows about one script. Build it with `analyze(text, path)`."""

    def __init__(self, text: str, path: str, tree: ast.Module, pending_imports: dict[str, str] | None = None) -> None:
        self.text = text
        self.path = path
        self.tree = tree
        self.names = ImportTable(tree, pending_imports)
        self.parents: dict[ast.AST, ast.AST] = {}
        self.scope_of: dict[ast.AST, str] = {}
        self.stmt_of: dict[ast.AST, ast.stmt] = {}
        self.functions: dict[str, Function] = {}
        self.class_of_scope: dict[str, str] = {}
        self.model_classes: dict[str, ModelClass] = {}
        self.values: dict[Ref, set[tuple[str, Site | None]]] = defaultdict(set)
        self.returns: dict[str, set[tuple[str, Site | None]]] = defaultdict(set)
        self.models: list[ModelSite] = []
        self.loaders: list[LoaderSite] = []
        self.step_loops: list[LoopSite] = []
        self.epoch_loops: list[LoopSite] = []
        self.calls: list[CallSite] = []
        self.main_guard: ast.If | None = None
        self.entry: str | None = None

    # ----- positions -------------------------------------------------------------------------
    @cached_property
    def lines(self) -> list[str]:
        return _LINE_BREAK.split(self.text)

    def pos(self, node: ast.AST) -> Pos:
        """LibCST-style range of an ast node (character columns, not UTF-8 byte offsets)."""
        end_line = getattr(node, "end_lineno", node.lineno) or node.lineno
        end_col = getattr(node, "end_col_offset", node.col_offset) or 0
        return Pos(node.lineno, self._char_col(node.lineno, node.col_offset), end_line, self._char_col(end_line, end_col))

    def _char_col(self, line: int, byte_col: int) -> int:
        if self.text.isascii():
            return byte_col
        return len(self.lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", "ignore"))

    def site(self, node: ast.AST, cls: type[Site] = Site, **extra) -> Site:
        return cls(node=node, pos=self.pos(node), stmt=self.stmt_of.get(node, node), scope=self.scope_of.get(node, MODULE_SCOPE), **extra)

    # ----- names and values ------------------------------------------------------------------
    def qualname(self, expr: ast.AST) -> str | None:
        return self.names.qualname(expr)

    def ref(self, expr: ast.AST, scope: str | None = None) -> Ref | None:
        """The variable an expression reads: `x` (local or global) or `self.x`."""
        scope = self.scope_of.get(expr, MODULE_SCOPE) if scope is None else scope
        if isinstance(expr, ast.Name):
            fn = self.functions.get(scope)
            if fn is not None and expr.id in fn.locals:
                return Ref(scope, expr.id)
            return Ref(MODULE_SCOPE, expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
            cls = self.class_of_scope.get(scope)
            if cls:
                return Ref(cls, f"self.{expr.attr}")
        return None

    def roles(self, expr: ast.AST) -> set[tuple[str, Site | None]]:
        """What an expression evaluates to: (role, origin site) pairs."""
        if isinstance(expr, (ast.Name, ast.Attribute)):
            ref = self.ref(expr)
            found = set(self.values.get(ref, ())) if ref else set()
            if isinstance(expr, ast.Attribute) and expr.attr == "module":
                found |= {r for r in self.roles(expr.value) if r[0] == ROLE_MODEL}
            return found
        if isinstance(expr, ast.IfExp):
            return self.roles(expr.body) | self.roles(expr.orelse)
        if isinstance(expr, ast.NamedExpr):
            return self.roles(expr.value)
        if isinstance(expr, ast.Call):
            return self._call_roles(expr)
        return set()

    def has_role(self, expr: ast.AST, role: str) -> bool:
        return any(r == role for r, _ in self.roles(expr))

    def origins(self, expr: ast.AST, role: str) -> set[Site]:
        return {o for r, o in self.roles(expr) if r == role and o is not None}

    def _call_roles(self, call: ast.Call) -> set[tuple[str, Site | None]]:
        q = self.qualname(call.func) or ""
        site = self._constructor_site(call, q)
        if site is not None:
            return {site}
        if q in _TQDM and call.args:
            return self.roles(call.args[0]) | {(ROLE_PBAR, None)}
        if isinstance(call.func, ast.Attribute) and call.func.attr in _MODEL_KEEPING_METHODS:
            return {r for r in self.roles(call.func.value) if r[0] == ROLE_MODEL}
        callee = self.callee(call)
        if callee is not None:
            return set(self.returns.get(callee, ()))
        return set()

    def _constructor_site(self, call: ast.Call, q: str) -> tuple[str, Site | None] | None:
        if q == "torch.utils.data.DataLoader":
            return ROLE_LOADER, self._loader_sites.get(call)
        if self.is_model_constructor(q):
            return ROLE_MODEL, self._model_sites.get(call)
        if q in (DDP_WRAPPER, DP_WRAPPER) and call.args:
            return next(iter(r for r in self.roles(call.args[0]) if r[0] == ROLE_MODEL), (ROLE_MODEL, None))
        if q.startswith("torch.optim.lr_scheduler."):
            return ROLE_SCHEDULER, None
        if q.startswith("torch.optim.") and q.count(".") == 2:
            return ROLE_OPTIMIZER, None
        if q in _WRITERS:
            return ROLE_WRITER, None
        if q == "logging.getLogger":
            return ROLE_LOGGER, None
        if q == "torch.amp.GradScaler":
            return ROLE_SCALER, None
        if q.startswith("torch.nn.") and q.endswith("Loss"):
            return ROLE_CRITERION, None
        return None

    def is_model_constructor(self, q: str) -> bool:
        if q in self.model_classes:
            return True
        if q.startswith("torch.nn.") and q.count(".") == 2 and q not in _NOT_MODELS:
            last = q.rsplit(".", 1)[1]
            return last[:1].isupper() and not last.endswith("Loss")
        return q.startswith(_MODEL_FACTORIES) and (q.startswith("torchvision.models.") or "create_model" in q or q.endswith("from_pretrained"))

    def callee(self, call: ast.Call) -> str | None:
        """The scope name of a function this file defines that `call` invokes."""
        func = call.func
        scope = self.scope_of.get(call, MODULE_SCOPE)
        if isinstance(func, ast.Name):
            if func.id in self.functions:
                return func.id
            if f"{func.id}.__init__" in self.functions:
                return f"{func.id}.__init__"
            nested = f"{scope}.{func.id}"
            return nested if nested in self.functions else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            cls = self.class_of_scope.get(scope)
            name = f"{cls}.{func.attr}"
            return name if name in self.functions else None
        return None

    # ----- questions the transforms and rules ask ------------------------------------------
    @property
    def kind(self) -> ScriptKind:
        if not self.names.imports("torch"):
            return ScriptKind.NOT_TORCH
        qualnames = {c.qualname for c in self.calls}
        if "torch.multiprocessing.spawn" in qualnames:
            return ScriptKind.SPAWN
        if DDP_WRAPPER in qualnames or "torch.distributed.init_process_group" in qualnames:
            return ScriptKind.DDP
        if DP_WRAPPER in qualnames:
            return ScriptKind.DATA_PARALLEL
        return ScriptKind.SINGLE

    def calls_to(self, *qualnames: str) -> list[CallSite]:
        wanted = set(qualnames)
        return [c for c in self.calls if c.qualname in wanted]

    def calls_on(self, role: str, *methods: str) -> list[CallSite]:
        """Method calls on a value of `role` (`optimizer.step()`, `writer.add_scalar(...)`)."""
        out = []
        for c in self.calls:
            func = c.node.func  # type: ignore[attr-defined]
            if isinstance(func, ast.Attribute) and (not methods or func.attr in methods) and self.has_role(func.value, role):
                out.append(c)
        return out

    @property
    def train_loaders(self) -> list[LoaderSite]:
        return [ld for ld in self.loaders if ld.is_train]

    @cached_property
    def trained_models(self) -> list[ModelSite]:
        """Each model an optimizer updates, at the statement that binds it in the training scope.

        `target` is the variable the optimizer reads (`model`, `self.model`), `stmt` the assignment
        that binds it there, `placements` the later statements of that block that move it to a device.
        """
        found: dict[Ref, ModelSite] = {}
        for call in self.calls:
            if not (call.qualname.startswith("torch.optim.") and call.qualname.count(".") == 2):
                continue
            for node in ast.walk(call.node):
                ref = self.ref(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
                if ref is None or ref in found or not self.has_role(node, ROLE_MODEL):
                    continue
                binding = self._binding(ref, call.node)
                if binding is not None:
                    found[binding.target] = binding
        return list(found.values())

    def _binding(self, ref: Ref, used_at: ast.AST, depth: int = 0) -> ModelSite | None:
        """The assignment that gives `ref` its model, following function parameters to callers."""
        assigns = [
            s for s in self._assignments_to(ref)
            if (s.lineno <= used_at.lineno and self._same_or_outer_block(s, used_at)) or ref.name.startswith("self.")
        ]
        if assigns:
            stmt = assigns[-1] if not ref.name.startswith("self.") else assigns[0]
            origin = next(iter(self.origins(_assigned_value(stmt), ROLE_MODEL)), None)
            return self._model_binding(ref, stmt, origin)
        fn = self.functions.get(ref.scope)
        if fn is None or ref.name not in fn.params or depth > 5:
            return None
        for site in self.calls:
            if self.callee(site.node) == ref.scope:  # type: ignore[arg-type]
                arg = _argument_for(site.node, fn.params.index(ref.name), ref.name)  # type: ignore[arg-type]
                caller_ref = self.ref(arg) if arg is not None else None
                if caller_ref is not None:
                    return self._binding(caller_ref, site.node, depth + 1)
        return None

    def _same_or_outer_block(self, stmt: ast.stmt, node: ast.AST) -> bool:
        """Is `stmt` in a block that `node` runs in too (not inside an `if` that `node` is outside)?"""
        block = self.block_of(stmt)
        cur: ast.AST | None = node
        while cur is not None:
            if cur in block:
                return True
            cur = self.parents.get(cur)
        return False

    def _model_binding(self, ref: Ref, stmt: ast.stmt, origin: Site | None) -> ModelSite:
        value = _assigned_value(stmt)
        site = self.site(value, ModelSite, target=ref)
        site.stmt = stmt
        if isinstance(origin, ModelSite):
            site.class_name, site.has_batchnorm = origin.class_name, origin.has_batchnorm
        site.placements = self._placements_after(ref, stmt)
        return site

    def _assignments_to(self, ref: Ref) -> list[ast.stmt]:
        return self._assignments_by_ref.get(ref, [])

    @cached_property
    def _assignments_by_ref(self) -> dict[Ref, list[ast.stmt]]:
        """Every assignment statement, indexed once by the variable it binds, in source order."""
        index: dict[Ref, list[ast.stmt]] = defaultdict(list)
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for ref in {self.ref(t) for t in targets} - {None}:
                    index[ref].append(node)  # type: ignore[index]
        for stmts in index.values():
            stmts.sort(key=lambda n: (n.lineno, n.col_offset))
        return index

    def _placements_after(self, ref: Ref, stmt: ast.stmt) -> list[ast.stmt]:
        """Statements after `stmt` in its block, before the first loop, that move `ref` to a device."""
        block = self.block_of(stmt)
        out = []
        for later in block[block.index(stmt) + 1:]:
            if isinstance(later, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.ClassDef)):
                break
            if any(self._moves(node, ref) for node in ast.walk(later)):
                out.append(later)
        return out

    def _moves(self, node: ast.AST, ref: Ref) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("to", "cuda")
            and self.ref(node.func.value) == ref
        )

    def block_of(self, stmt: ast.stmt) -> list[ast.stmt]:
        """The statement list that holds `stmt` (a body, an orelse, ...)."""
        parent = self.parents.get(stmt, self.tree)
        for field_name in ("body", "orelse", "finalbody"):
            block = getattr(parent, field_name, None)
            if isinstance(block, list) and stmt in block:
                return block
        return [stmt]

    def refs_holding(self, origin: Site, role: str) -> set[Ref]:
        return {ref for ref, vals in self.values.items() if (role, origin) in vals}

    def enclosing(self, node: ast.AST, kinds: type | tuple[type, ...]) -> Iterator[ast.AST]:
        """Ancestors of `node` of the given node types, innermost first, within its function."""
        cur = self.parents.get(node)
        while cur is not None and not isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if isinstance(cur, kinds):
                yield cur
            cur = self.parents.get(cur)

    def function_contains(self, scope: str, predicate, _seen: set[str] | None = None) -> bool:
        """Does function `scope`, or anything it calls, contain a node matching predicate?"""
        seen = set() if _seen is None else _seen
        if scope in seen or scope not in self.functions:
            return False
        seen.add(scope)
        return self.body_contains(self.functions[scope].node.body, predicate, seen)

    def body_contains(self, body: Iterable[ast.AST], predicate, _seen: set[str] | None = None) -> bool:
        seen = set() if _seen is None else _seen
        for node in walk_body(body):
            if predicate(node):
                return True
            if isinstance(node, ast.Call):
                callee = self.callee(node)
                if callee and self.function_contains(callee, predicate, seen):
                    return True
        return False

    def is_training_call(self, node: ast.AST) -> bool:
        """`loss.backward()`, `optimizer.step()` or `scaler.step(optimizer)`."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return False
        attr = node.func.attr
        if attr == "backward":
            return True
        return attr == "step" and (self.has_role(node.func.value, ROLE_OPTIMIZER) or self.has_role(node.func.value, ROLE_SCALER))

    # populated by the analysis
    _loader_sites: dict[ast.Call, LoaderSite]
    _model_sites: dict[ast.Call, ModelSite]


def analyze(text: str, path: str = "<string>", tree: ast.Module | None = None, pending_imports: dict[str, str] | None = None) -> Anatomy:
    """Parse `text` (unless `tree` is given) and find its anatomy.

    `pending_imports` maps local names to qualified names for imports a codemod will add later.
    """
    tree = ast.parse(text, filename=path) if tree is None else tree
    anatomy = Anatomy(text, path, tree, pending_imports)
    _Indexer(anatomy).run()
    _ValueFlow(anatomy).run()
    _find_loops(anatomy)
    _find_entry(anatomy)
    return anatomy


def walk_body(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node under the statements, not descending into nested functions or classes."""
    stack = list(reversed(list(body)))
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack.append(child)


class _Indexer:
    """One walk: parents, scopes, statements, functions, classes, and the interesting calls."""

    def __init__(self, anatomy: Anatomy) -> None:
        self.a = anatomy

    def run(self) -> None:
        a = self.a
        self._collect_classes()
        stack: list[tuple[ast.AST, str, str | None, ast.stmt | None]] = [(a.tree, MODULE_SCOPE, None, None)]
        while stack:
            node, scope, cls, stmt = stack.pop()
            for child in ast.iter_child_nodes(node):
                a.parents[child] = node
                child_stmt = child if isinstance(child, ast.stmt) else stmt
                a.scope_of[child] = scope
                if child_stmt is not None:
                    a.stmt_of[child] = child_stmt
                inner_scope, inner_cls = self._enter(child, scope, cls)
                stack.append((child, inner_scope, inner_cls, child_stmt))
        a._model_sites = {}
        a._loader_sites = {}
        for node in ast.walk(a.tree):
            if isinstance(node, ast.Call):
                self._record_call(node)

    def _enter(self, node: ast.AST, scope: str, cls: str | None) -> tuple[str, str | None]:
        if isinstance(node, ast.ClassDef):
            name = node.name if scope == MODULE_SCOPE else f"{scope}.{node.name}"
            self.a.class_of_scope[name] = name
            return name, name
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_class = cls is not None and scope == cls
            name = node.name if scope == MODULE_SCOPE else f"{scope}.{node.name}"
            self.a.functions[name] = Function(node, name, cls if in_class else None, _local_names(node))
            if in_class:
                self.a.class_of_scope[name] = cls  # type: ignore[assignment]
            return name, cls if in_class else None
        return scope, cls

    def _collect_classes(self) -> None:
        a = self.a
        classes = {n.name: n for n in a.tree.body if isinstance(n, ast.ClassDef)}
        changed = True
        while changed:
            changed = False
            for name, node in classes.items():
                if name in a.model_classes:
                    continue
                bases = {a.qualname(b) for b in node.bases}
                if "torch.nn.Module" in bases or bases & set(a.model_classes):
                    a.model_classes[name] = _describe_model_class(a, node)
                    changed = True
        for mc in a.model_classes.values():  # inherited batchnorm
            for base in (a.qualname(b) for b in mc.node.bases):
                if base in a.model_classes and a.model_classes[base].has_batchnorm:
                    mc.has_batchnorm = True

    def _record_call(self, call: ast.Call) -> None:
        a = self.a
        q = a.qualname(call.func) or ""
        if isinstance(call.func, ast.Name) and call.func.id in a.functions:
            q = call.func.id
        site = a.site(call, CallSite, qualname=q)
        a.calls.append(site)  # type: ignore[arg-type]
        if q == "torch.utils.data.DataLoader":
            loader = a.site(call, LoaderSite, call=call)
            a._loader_sites[call] = loader  # type: ignore[assignment]
            a.loaders.append(loader)  # type: ignore[arg-type]
        elif a.is_model_constructor(q):
            mc = a.model_classes.get(q)
            model = a.site(call, ModelSite, class_name=q, has_batchnorm=mc.has_batchnorm if mc else None)
            if mc is None and q.startswith("torch.nn."):
                model.has_batchnorm = any(  # type: ignore[attr-defined]
                    isinstance(n, ast.Call) and bool(_BATCHNORM.match(a.qualname(n.func) or "")) for n in ast.walk(call)
                )
            a._model_sites[call] = model  # type: ignore[assignment]


def _describe_model_class(a: Anatomy, node: ast.ClassDef) -> ModelClass:
    mc = ModelClass(node=node, name=node.name)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mc.methods.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            mc.attributes.update(t.id for t in targets if isinstance(t, ast.Name))
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self" and isinstance(sub.ctx, ast.Store):
            mc.attributes.add(sub.attr)
        if isinstance(sub, ast.Call) and _BATCHNORM.match(a.qualname(sub.func) or ""):
            mc.has_batchnorm = True
    return mc


def _local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Parameters and names assigned in the function body (minus `global`/`nonlocal` ones)."""
    args = fn.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names.update(a.arg for a in (args.vararg, args.kwarg) if a)
    declared_global: set[str] = set()
    for node in walk_body(fn.body):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared_global.update(node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names - declared_global


class _ValueFlow:
    """Propagate roles through assignments, arguments and returns until nothing changes."""

    MAX_ROUNDS = 8

    def __init__(self, anatomy: Anatomy) -> None:
        self.a = anatomy
        self.assignments = [n for n in ast.walk(anatomy.tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.withitem, ast.NamedExpr))]
        self.returns = [n for n in ast.walk(anatomy.tree) if isinstance(n, ast.Return) and n.value is not None]
        self.local_calls = [c for c in anatomy.calls if anatomy.callee(c.node) is not None]  # type: ignore[arg-type]

    def run(self) -> None:
        for _ in range(self.MAX_ROUNDS):
            before = sum(len(v) for v in self.a.values.values()) + sum(len(v) for v in self.a.returns.values())
            self._flow_assignments()
            self._flow_arguments()
            self._flow_returns()
            after = sum(len(v) for v in self.a.values.values()) + sum(len(v) for v in self.a.returns.values())
            if after == before:
                break
        self._bind_origins()

    def _flow_assignments(self) -> None:
        for node in self.assignments:
            for target, value in _assigned_pairs(node):
                ref = self.a.ref(target)
                if ref is not None:
                    self.a.values[ref] |= self.a.roles(value)

    def _flow_arguments(self) -> None:
        for site in self.local_calls:
            call: ast.Call = site.node  # type: ignore[assignment]
            callee = self.a.callee(call)
            fn = self.a.functions[callee]  # type: ignore[index]
            params = fn.params
            for param, arg in zip(params, call.args):
                self.a.values[Ref(fn.scope, param)] |= self.a.roles(arg)
            for kw in call.keywords:
                if kw.arg in params:
                    self.a.values[Ref(fn.scope, kw.arg)] |= self.a.roles(kw.value)

    def _flow_returns(self) -> None:
        for ret in self.returns:
            scope = self.a.scope_of.get(ret, MODULE_SCOPE)
            self.a.returns[scope] |= self.a.roles(ret.value)  # type: ignore[arg-type]

    def _bind_origins(self) -> None:
        """Give each model and loader site the variable it is first bound to, and its placements."""
        a = self.a
        for node in self.assignments:
            for target, value in _assigned_pairs(node):
                ref = a.ref(target)
                if ref is None:
                    continue
                for origin in _direct_origins(a, value):
                    if getattr(origin, "target", "unset") is None:
                        origin.target = ref  # type: ignore[attr-defined]
        a.models = [m for m in a._model_sites.values() if m.target is not None and m.target.scope not in a.model_classes]


def _assigned_pairs(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    if isinstance(node, ast.Assign):
        return [(t, node.value) for t in node.targets]
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return [(node.target, node.value)]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [(node.optional_vars, node.context_expr)]
    if isinstance(node, ast.NamedExpr):
        return [(node.target, node.value)]
    return []


def _assigned_value(stmt: ast.stmt) -> ast.AST:
    return stmt.value  # type: ignore[attr-defined, return-value]


def _argument_for(call: ast.Call, index: int, name: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return call.args[index] if index < len(call.args) else None


def _direct_origins(a: Anatomy, value: ast.AST) -> list[Site]:
    """Sites constructed by the expression itself (through `.to()`/`.cuda()` chains)."""
    while isinstance(value, ast.Call):
        site = a._model_sites.get(value) or a._loader_sites.get(value)
        if site is not None:
            return [site]
        if isinstance(value.func, ast.Attribute) and value.func.attr in _MODEL_KEEPING_METHODS:
            value = value.func.value
        else:
            return []
    return []


def _find_loops(a: Anatomy) -> None:
    """Step loops iterate a loader; epoch loops contain training step loops (maybe via calls)."""
    for node in ast.walk(a.tree):
        if not isinstance(node, (ast.For, ast.AsyncFor)):
            continue
        loader = _iterated_loader(a, node.iter)
        if loader is not None:
            trains = a.body_contains(node.body, a.is_training_call)
            a.step_loops.append(a.site(node, LoopSite, loader=loader, loop_var=_loop_var(node), trains=trains))  # type: ignore[arg-type]
            if trains:
                loader.is_train = True
    train_loop_nodes = {loop.node for loop in a.step_loops if loop.trains}
    for node in ast.walk(a.tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and node not in {l.node for l in a.step_loops}:
            if a.body_contains(node.body, lambda n: n in train_loop_nodes):
                a.epoch_loops.append(a.site(node, LoopSite, loop_var=_loop_var(node), trains=True))  # type: ignore[arg-type]


def _iterated_loader(a: Anatomy, expr: ast.AST) -> LoaderSite | None:
    while isinstance(expr, ast.Call) and (a.qualname(expr.func) in _ITER_WRAPPERS) and expr.args:
        expr = expr.args[0]
    if isinstance(expr, ast.Call) and expr in a._loader_sites:
        return a._loader_sites[expr]
    found = a.origins(expr, ROLE_LOADER)
    return next(iter(sorted(found, key=lambda s: s.line)), None) if found else None  # type: ignore[return-value]


def _loop_var(loop: ast.For | ast.AsyncFor) -> str | None:
    """`epoch` in `for epoch in ...` and in `for epoch, item in enumerate(...)`."""
    target = loop.target
    if isinstance(target, ast.Tuple) and target.elts and isinstance(loop.iter, ast.Call):
        if isinstance(loop.iter.func, ast.Name) and loop.iter.func.id == "enumerate":
            target = target.elts[0]
    return target.id if isinstance(target, ast.Name) and target.id != "_" else None


def _find_entry(a: Anatomy) -> None:
    """The `if __name__ == "__main__":` block and the local function it calls first."""
    for node in a.tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            a.main_guard = node
            for sub in walk_body(node.body):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in a.functions:
                    a.entry = sub.func.id
                    return
            return


def _is_main_test(test: ast.AST) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )
