"""Find a training script's anatomy once, for the codemods and the lint rules alike.

The analysis runs on Python's `ast` (a C parser, ~30x faster than building a LibCST tree), and
every fact carries a LibCST-style position, so a codemod finds the CST node at the same place.
Values are followed through assignments, `self.attr`, function arguments and return values, so a
model built in `main()` and handed to `train_one_epoch(model, loader, ...)` is the same model there.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Iterator

from ddpify.anatomy.bindings import Binding, bindings
from ddpify.anatomy.facts import EPOCHS, NO_FACTS, STEPS, ProjectFacts
from ddpify.anatomy.names import ImportTable
from ddpify.anatomy.syntax import argument, constant
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
from ddpify.anatomy.vocabulary import (
    BATCHNORM,
    DISTRIBUTING_FRAMEWORKS,
    BLOCK_SEQUENCES,
    PARAMETER_CONSTRUCTOR,
    DDP_WRAPPER,
    DEVICE_MOVES,
    DP_WRAPPER,
    ITERATION_WRAPPERS,
    MODEL_WRAPPERS,
    MODULE_RETURNING_SELF,
    PARAMETER_METHODS,
    TQDM_CONSTRUCTORS,
    WRITER_CONSTRUCTORS,
    is_builtin_layer,
    is_criterion_class,
    is_model_factory,
    is_optimizer_constructor,
    is_scheduler_constructor,
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
ROLE_MODELS = "models"  # a list or dict literal of models; its origins are the models'

_MODEL_KEEPING_METHODS = MODULE_RETURNING_SELF | {"module"}  # `model.module` is the model too
_BRANCHING = (ast.If, ast.Try, ast.TryStar, ast.With, ast.AsyncWith, ast.Match)  # a binding in their blocks is one after them
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


@dataclass
class ModelClass:
    """An `nn.Module` subclass defined in the script."""

    node: ast.ClassDef
    name: str
    methods: set[str] = field(default_factory=set)
    attributes: set[str] = field(default_factory=set)
    has_batchnorm: bool = False
    block_lists: list[str] = field(default_factory=list)  # `self.layers = nn.ModuleList([Block() ...])`
    parameters: set[str] = field(default_factory=set)  # `self.scale = nn.Parameter(...)`

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

    def __init__(self, text: str, path: str, tree: ast.Module, pending_imports: dict[str, str] | None = None,
                 facts: ProjectFacts = NO_FACTS) -> None:
        self.text = text
        self.path = path
        self.tree = tree
        self.facts = facts
        self.nodes: list[ast.AST] = []  # every node, in ast.walk's order: the whole-tree scans share one walk
        self.parents: dict[ast.AST, ast.AST] = {}
        self.scope_of: dict[ast.AST, str] = {}
        self.stmt_of: dict[ast.AST, ast.stmt] = {}
        self.functions: dict[str, Function] = {}
        self.class_of_scope: dict[str, str] = {}
        _Structure(self).walk()
        self.names = ImportTable(self.nodes, pending_imports)
        self.model_classes: dict[str, ModelClass] = {}
        self.values: dict[Ref, set[tuple[str, Site | None]]] = defaultdict(set)
        self.returns: dict[str, set[tuple[str, Site | None]]] = defaultdict(set)
        self.item_returns: dict[tuple[str, int], set[tuple[str, Site | None]]] = defaultdict(set)  # `return a, b`
        self.models: list[ModelSite] = []
        self.loaders: list[LoaderSite] = []  # the DataLoader calls of this file
        self.foreign_loaders: list[LoaderSite] = []  # stand-ins for loaders other files build (ddpify.anatomy.project)
        self.step_loops: list[LoopSite] = []
        self.epoch_loops: list[LoopSite] = []
        self.delegated_steps: list[LoopSite] = []  # calls into another file that iterate a loader of this one
        # `iter(loader)` calls whose batches training draws with next(): each starts a pass over the
        # loader (the call node; the training loop it stands in, when it restarts the pass there)
        self.iterator_passes: list[tuple[ast.Call, LoaderSite, ast.stmt | None]] = []
        self.loader_iters: list[tuple[ast.Call, LoaderSite]] = []  # every `iter(loader)`: a pass of its own
        self.foreign_models: list[ModelSite] = []  # stand-ins for models other files hand in (ddpify.anatomy.project)
        self.wrapped_elsewhere: set[ModelSite] = set()  # models that arrive already wrapped in DDP
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
        if isinstance(expr, (ast.List, ast.Dict)):
            items = expr.elts if isinstance(expr, ast.List) else expr.values
            return {(ROLE_MODELS, o) for item in items if item is not None for r, o in self.roles(item) if r == ROLE_MODEL}
        if isinstance(expr, ast.NamedExpr):
            return self.roles(expr.value)
        if isinstance(expr, ast.Call):
            return self._call_roles(expr)
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Call) and _int_constant(expr.slice):
            return self._item_roles(expr.value, expr.slice.value)  # type: ignore[attr-defined]
        return set()

    def _is_model_registry(self, expr: ast.AST) -> bool:
        """`MODELS` in `MODELS[name](...)`: a module-level dict or list literal of model classes only."""
        if not isinstance(expr, ast.Name):
            return False
        assigns = self._assignments_to(Ref(MODULE_SCOPE, expr.id))
        value = _assigned_value(assigns[-1]) if len(assigns) == 1 else None
        entries = value.values if isinstance(value, ast.Dict) else value.elts if isinstance(value, (ast.List, ast.Tuple)) else []
        return bool(entries) and all(e is not None and self.is_model_constructor(self.qualname(e) or "") for e in entries)

    def _item_roles(self, call: ast.Call, index: int) -> set[tuple[str, Site | None]]:
        """What item `index` of the tuple a call returns is (`train_loader, val_loader = get_loaders()`)."""
        callee = self.callee(call)
        if callee is not None:
            return set(self.item_returns.get((callee, index), ()))
        exported = self.facts.imported.get(self.qualname(call.func) or "")
        if exported is None or index >= len(exported.items):
            return set()
        return {(role, self._item_sites.get((call, index)) if role == ROLE_LOADER else None) for role in exported.items[index]}

    def has_role(self, expr: ast.AST, role: str) -> bool:
        return any(r == role for r, _ in self.roles(expr))

    def origins(self, expr: ast.AST, role: str) -> set[Site]:
        return {o for r, o in self.roles(expr) if r == role and o is not None}

    def _call_roles(self, call: ast.Call) -> set[tuple[str, Site | None]]:
        q = self.qualname(call.func) or ""
        site = self._constructor_site(call, q)
        if site is not None:
            return {site}
        if q in TQDM_CONSTRUCTORS and call.args:
            return self.roles(call.args[0]) | {(ROLE_PBAR, None)}
        if isinstance(call.func, ast.Attribute) and call.func.attr in _MODEL_KEEPING_METHODS:
            return {r for r in self.roles(call.func.value) if r[0] == ROLE_MODEL}
        if isinstance(call.func, ast.Subscript) and self._is_model_registry(call.func.value):
            return {(ROLE_MODEL, None)}
        callee = self.callee(call)
        if callee is not None:
            return set(self.returns.get(callee, ()))
        imported = self.facts.imported.get(q)
        return {(role, None) for role in imported.roles} if imported else set()

    def _constructor_site(self, call: ast.Call, q: str) -> tuple[str, Site | None] | None:
        if q == "torch.utils.data.DataLoader" or self.facts.returns(q, ROLE_LOADER):
            return ROLE_LOADER, self._loader_sites.get(call)
        if self.is_model_constructor(q):
            return ROLE_MODEL, self._model_sites.get(call)
        if q in MODEL_WRAPPERS and call.args:
            return next(iter(r for r in self.roles(call.args[0]) if r[0] == ROLE_MODEL), (ROLE_MODEL, None))
        if is_scheduler_constructor(q):
            return ROLE_SCHEDULER, None
        if is_optimizer_constructor(q):
            return ROLE_OPTIMIZER, None
        if q in WRITER_CONSTRUCTORS:
            return ROLE_WRITER, None
        if q == "logging.getLogger":
            return ROLE_LOGGER, None
        if q == "torch.amp.GradScaler":
            return ROLE_SCALER, None
        if is_criterion_class(q):
            return ROLE_CRITERION, None
        return None

    def is_model_constructor(self, q: str) -> bool:
        if q in self.model_classes or self.facts.returns(q, ROLE_MODEL):
            return True
        return is_builtin_layer(q) or is_model_factory(q)

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
            if nested in self.functions:
                return nested
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            cls = self.class_of_scope.get(scope)
            name = f"{cls}.{func.attr}"
            if name in self.functions:
                return name
        return self._called_instance(func)

    def _called_instance(self, func: ast.AST) -> str | None:
        """`stopper(loss, model)`, where `stopper` (or `self.stopper`) only ever holds an instance of
        a local class that defines `__call__`: that method."""
        ref = self.ref(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
        values = [_assigned_value(s) for s in self._assignments_to(ref)] if ref is not None else []
        classes = {v.func.id if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) else None for v in values}
        if len(classes) != 1 or None in classes:
            return None
        method = f"{classes.pop()}.__call__"
        return method if method in self.functions else None

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
        if self.framework is not None:
            return ScriptKind.FRAMEWORK
        if DP_WRAPPER in qualnames:
            return ScriptKind.DATA_PARALLEL
        return ScriptKind.SINGLE

    @cached_property
    def framework(self) -> tuple[str, CallSite] | None:
        """The library that distributes this script (Accelerate, Lightning, ...) and the call that
        hands it the training: `Accelerator()`, `pl.Trainer(...)`, `deepspeed.initialize(...)`, or a
        local subclass of one of them."""
        subclasses = {
            name: DISTRIBUTING_FRAMEWORKS[base]
            for name, node in ((n.name, n) for n in self.tree.body if isinstance(n, ast.ClassDef))
            for base in (self.qualname(b) for b in node.bases) if base in DISTRIBUTING_FRAMEWORKS
        }
        for call in self.calls:
            label = DISTRIBUTING_FRAMEWORKS.get(call.qualname) or subclasses.get(call.qualname)
            if label:
                return label, call
        return None

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
        """Each model an optimizer (or a hand-written update) trains, where it reaches its device.

        `target` is the variable the optimizer reads (`model`, `self.model`), `stmt` the assignment
        that binds it there, `placements` the later statements of that block that move it to a device.
        A model handed to a class whose `__init__` moves it (`self.model = model.to(device)`) is
        bound there instead. Parameters are followed through local variables (param groups built
        in a list first) and, without any optimizer, through `for p in model.parameters():` loops
        that update `p` in place.
        """
        return self._trained_model_bindings[0]

    @property
    def trained_models_unbound(self) -> list[tuple[ast.AST, ast.AST]]:
        """(read, the optimizer call or loop it is read at) for models that are trained but whose
        binding the analysis can't find, so nothing can wrap them (`enc, dec = make_pair()`)."""
        return self._trained_model_bindings[1]

    @cached_property
    def _trained_model_bindings(self) -> tuple[list[ModelSite], list[tuple[ast.AST, ast.AST]]]:
        found: dict[Ref, ModelSite] = {}
        unbound: dict[Ref, tuple[ast.AST, ast.AST]] = {}
        for node, used_at in self._trained_model_reads():
            ref = self.ref(node)
            if ref is None or ref in found or not self.has_role(node, ROLE_MODEL):
                continue
            binding = self._binding(ref, used_at)
            if binding is not None:
                binding = self._moved_by_callee(binding) or self._moved_by_method(binding) or binding
                found[binding.target] = binding
            elif ref.name != "self" and not self.origins(node, ROLE_MODEL) & set(self.foreign_models):
                unbound.setdefault(ref, (node, used_at))  # (`self` is a model class's own: bound where it is built)
        bound = {model.target for model in found.values()}
        in_order = sorted(found.values(), key=lambda model: (model.pos.line, model.pos.col))
        return in_order, [read for ref, read in unbound.items() if ref not in bound]

    def _trained_model_reads(self) -> Iterator[tuple[ast.AST, ast.AST]]:
        """(variable read, call or loop it is read at) for what each optimizer is built over."""
        for call in self.optimizers:
            for node in self._walk_through_variables(call.node):
                if isinstance(node, (ast.Name, ast.Attribute)):
                    yield node, call.node
        if not self.optimizers:
            for loop, receiver in self._manual_update_loops():
                yield receiver, loop

    @cached_property
    def optimizers(self) -> list[CallSite]:
        """Every optimizer construction (`torch.optim.SGD(...)`, or another project file's builder), in source order."""
        return [c for c in self.calls if self._builds_optimizer(c.qualname)]

    @cached_property
    def optimizers_without_model(self) -> list[CallSite]:
        """Optimizers whose parameters come from no model the analysis can bind (nothing to wrap)."""
        return [c for c in self.optimizers if not self._models_trained_by(c) and not self._reads_incoming_model(c)]

    def _reads_incoming_model(self, optimizer: CallSite) -> bool:
        """Does the optimizer read a parameter that another project file fills with a model (that file binds and wraps it)?"""
        incoming = self.facts.params.get(optimizer.scope, {})
        return any(isinstance(n, ast.Name) and n.id in incoming and ROLE_MODEL in incoming[n.id].roles for n in ast.walk(optimizer.node))

    @cached_property
    def training_calls(self) -> list[CallSite]:
        """`loss.backward()`, `optimizer.step()`, `scaler.step(...)`: where the script trains."""
        return [c for c in self.calls if self.is_training_call(c.node)]

    @property
    def trains(self) -> bool:
        """Does the script train anything (an optimizer, or a backward pass)?"""
        return bool(self.optimizers or self.training_calls)

    def _models_trained_by(self, optimizer: CallSite) -> list[ModelSite]:
        """The model bindings whose parameters `optimizer` reads (through the variables it is built from)."""
        found: dict[Ref, ModelSite] = {}
        for node in self._walk_through_variables(optimizer.node):
            ref = self.ref(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if ref is None or ref in found or not self.has_role(node, ROLE_MODEL):
                continue
            binding = self._binding(ref, optimizer.node)
            if binding is not None:
                found[ref] = binding
        return list(found.values())

    def _builds_optimizer(self, qualname: str) -> bool:
        """`torch.optim.SGD(...)`, or a function of another project file that returns an optimizer."""
        return is_optimizer_constructor(qualname) or self.facts.returns(qualname, ROLE_OPTIMIZER)

    def _walk_through_variables(self, expr: ast.AST, depth: int = 0) -> Iterator[ast.AST]:
        """Nodes of `expr`, and of the values its local variables were last given (`groups = [...]`)."""
        for node in ast.walk(expr):
            yield node
            ref = self.ref(node) if isinstance(node, ast.Name) and depth < 3 else None
            if ref is None or ref.scope != self.scope_of.get(node, MODULE_SCOPE) or self.roles(node):
                continue
            earlier = [s for s in self._assignments_to(ref) if s.lineno <= node.lineno]
            if earlier:
                yield from self._walk_through_variables(_assigned_value(earlier[-1]), depth + 1)

    def _manual_update_loops(self) -> Iterator[tuple[ast.For, ast.AST]]:
        """`for p in model.parameters(): p.data.add_(-lr * p.grad)` (or `p -= lr * p.grad`): (loop, model)."""
        for node in self.nodes:
            if not (isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Call)):
                continue
            func = node.iter.func
            if isinstance(func, ast.Attribute) and func.attr == "parameters" and _updates_in_place(node.body, node.target.id):
                yield node, func.value

    def moved_where_bound(self, site: ModelSite) -> bool:
        """Does the model reach a device where it is bound: `.to()`/`.cuda()` in the bound value or
        a later statement of its block, or a local function it is built by that moves a model?"""
        if site.placements or _moves_any(site.node):
            return True
        calls = [self.callee(n) for n in ast.walk(site.node) if isinstance(n, ast.Call)]
        return any(callee and self.function_contains(callee, self._moves_a_model) for callee in calls)

    def _moves_a_model(self, node: ast.AST) -> bool:
        """`model.to(device)` (on a model), or `return <value>.to(device)` in the function that builds it."""
        if isinstance(node, ast.Return):
            return node.value is not None and _moves_any(node.value)
        return (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DEVICE_MOVES
            and self.has_role(node.func.value, ROLE_MODEL)
        )

    def _moved_by_callee(self, site: ModelSite) -> ModelSite | None:
        """The binding inside a class or function the model is handed to, when that is where it
        reaches its device (`Trainer(model, ...)` whose `__init__` does `self.model = model.to(device)`)."""
        if self.moved_where_bound(site):
            return None
        block = self.block_of(site.stmt)
        for later in block[block.index(site.stmt) + 1:]:
            for call in (n for n in walk_body([later]) if isinstance(n, ast.Call)):
                callee = self.callee(call)
                params = self.functions[callee].params if callee else []
                for index, param in enumerate(params):
                    arg = _argument_for(call, index, param)
                    if arg is not None and self.ref(arg) == site.target:
                        moved = self._device_binding_in(callee, param)  # type: ignore[arg-type]
                        if moved is not None:
                            moved.class_name, moved.has_batchnorm = site.class_name, site.has_batchnorm
                            return moved
        return None

    def _moved_by_method(self, site: ModelSite) -> ModelSite | None:
        """The move of a model attribute in another method of its class (`def to_device(self, device):
        self.model.to(device)`), when that is where it reaches its device: a statement of that method's
        own block, in a method that trains nothing and that the file calls once, outside any loop (so
        a wrap after the move is made once, on the moved parameters)."""
        cls = self.class_of_scope.get(site.scope)
        if cls is None or not site.target.name.startswith("self.") or self.moved_where_bound(site):
            return None
        moves = [self.stmt_of[n] for n in self.nodes if self.class_of_scope.get(self.scope_of.get(n, MODULE_SCOPE)) == cls
                 and self.scope_of.get(n) != site.scope and self._moves(n, site.target)]
        scopes = {self.scope_of[stmt] for stmt in moves}
        if len(scopes) != 1 or not self._runs_once((scope := scopes.pop())):
            return None
        last = moves[-1]
        if self.block_of(last) is not self.functions[scope].node.body:
            return None
        moved = self._model_binding(site.target, last, None, last)
        moved.class_name, moved.has_batchnorm = site.class_name, site.has_batchnorm
        return moved

    def _runs_once(self, scope: str) -> bool:
        """Is function `scope` called from exactly one place, in no loop, and does it train nothing?"""
        calls = [c for c in self.calls if self._calls_method(c.node, scope)]  # type: ignore[arg-type]
        return (len(calls) == 1 and next(self.enclosing(calls[0].node, _LOOPS), None) is None
                and not self.function_contains(scope, self.is_training_call))

    def _calls_method(self, call: ast.Call, scope: str) -> bool:
        """`self.setup(...)` inside the class, or `runner.setup(...)` on an instance of it."""
        if self.callee(call) == scope:
            return True
        cls, _, method = scope.rpartition(".")
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == method and isinstance(func.value, (ast.Name, ast.Attribute))):
            return False
        ref = self.ref(func.value)
        values = [_assigned_value(s) for s in self._assignments_to(ref)] if ref is not None else []
        return bool(values) and all(isinstance(v, ast.Call) and self.qualname(v.func) == cls for v in values)

    def _device_binding_in(self, scope: str, param: str) -> ModelSite | None:
        """`self.x = param.to(device)` (or `self.x = param` then `self.x.to(device)`) in `scope`."""
        for stmt in walk_body(self.functions[scope].node.body):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            ref = self.ref(stmt.targets[0])
            if ref is None or not ref.name.startswith("self.") or not _reads_name(stmt.value, param):
                continue
            binding = self._model_binding(ref, stmt, None)
            if binding.placements or _moves_any(stmt.value):
                return binding
        return None

    def _binding(self, ref: Ref, used_at: ast.AST, depth: int = 0) -> ModelSite | None:
        """The statement that gives `ref` its model, following function parameters to callers: the
        last assignment on the way to `used_at`, or the if/try/with/match whose branches assign it
        (`if arch == "a": model = A() else: model = B()`: one variable, bound once the branches end)."""
        given = self._reaching_bindings(ref, used_at)
        if given:
            stmt = self.statement_binding(given[-1].stmt, None if ref.name.startswith("self.") else used_at)
            if stmt is given[-1].stmt:
                value = given[-1].value
                origin = next(iter(self.origins(value, ROLE_MODEL)), None) if value is not None else None
                return self._model_binding(ref, stmt, origin, value)  # type: ignore[arg-type]
            return self._branches_binding(ref, stmt, given)  # type: ignore[arg-type]
        container = self._iterated_container(ref)
        if container is not None:
            return self._container_binding(container, used_at, depth)
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

    def _reaching_bindings(self, ref: Ref, used_at: ast.AST) -> list[Binding]:
        """The assignments that bind `ref` in the statement reaching `used_at` (for `self.x`, in the first
        statement binding it): one assignment, or each made in the branches of one compound statement."""
        if ref.name.startswith("self."):
            given = self._values_given(ref)
            first = self.statement_binding(given[0].stmt) if given else None
            return [b for b in given if b.stmt is first or self._holds(first, b.stmt)]  # type: ignore[arg-type]
        reaching: dict[ast.stmt, list[Binding]] = defaultdict(list)
        for b in self._values_given(ref):
            stmt = self.statement_binding(b.stmt, used_at) if b.stmt.lineno <= used_at.lineno else None
            if stmt is not None:
                reaching[stmt].append(b)
        last = max(reaching, key=lambda s: (s.lineno, s.col_offset), default=None)
        return reaching[last] if last is not None else []

    def statement_binding(self, stmt: ast.stmt, used_at: ast.AST | None = None) -> ast.stmt | None:
        """The statement after which what `stmt` binds is bound: `stmt`, or the outermost if/try/with/match
        around it that stands in a block `used_at` runs in (None when none does, or one holds `used_at`).
        Without `used_at`, the outermost such statement of its function."""
        while used_at is None or not self.same_or_outer_block(stmt, used_at):
            around = self._branching_around(stmt)
            if around is None or (used_at is not None and self._holds(around, used_at)):
                return stmt if used_at is None else None
            stmt = around
        return stmt

    def _branching_around(self, stmt: ast.stmt) -> ast.stmt | None:
        """The if/try/with/match whose block (a branch, a handler, a case) holds `stmt`."""
        parent = self.parents.get(stmt)
        if isinstance(parent, (ast.excepthandler, ast.match_case)):
            parent = self.parents.get(parent)
        return parent if isinstance(parent, _BRANCHING) else None

    def _holds(self, stmt: ast.AST, node: ast.AST) -> bool:
        """Is `node` inside `stmt`?"""
        cur = self.parents.get(node)
        while cur is not None and cur is not stmt:
            cur = self.parents.get(cur)
        return cur is stmt

    def _branches_binding(self, ref: Ref, stmt: ast.stmt, given: list[Binding]) -> ModelSite:
        """The model `ref` gets in the branches of `stmt`: wrapped once, after it (and after its moves)."""
        origins = [o for b in given if b.value is not None for r, o in self.roles(b.value) if r == ROLE_MODEL]
        site = self._model_binding(ref, stmt, None, stmt)
        classes = {o.class_name if isinstance(o, ModelSite) else "" for o in origins}
        site.class_name = classes.pop() if len(classes) == 1 else ""
        site.has_batchnorm = any_batchnorm(o.has_batchnorm if isinstance(o, ModelSite) else None for o in origins)
        return site

    def _iterated_container(self, ref: Ref) -> ast.AST | None:
        """`nets` when `ref` is the variable of `for net in nets` / `... for net in nets.values()`."""
        for target, element_of in self._loop_targets:
            if isinstance(target, ast.Name) and target.id == ref.name and self.ref(target) == ref:
                return element_of
        return None

    @cached_property
    def _loop_targets(self) -> list[tuple[ast.AST, ast.AST]]:
        """(loop variable, the list or dict it walks) of every for loop and comprehension."""
        found = []
        for node in self.nodes:
            if isinstance(node, (ast.For, ast.comprehension)):
                container = _container_iterated(node.iter)
                if container is not None:
                    found.append((node.target, container))
        return found

    def _container_binding(self, container: ast.AST, used_at: ast.AST, depth: int) -> ModelSite | None:
        ref = self.ref(container, self.scope_of.get(used_at, MODULE_SCOPE))
        if ref is None or not self.has_role(container, ROLE_MODELS):
            return None
        site = self._binding(ref, used_at, depth + 1)
        if site is not None:
            value = _assigned_value(site.stmt)
            site.container = "dict" if isinstance(value, ast.Dict) else "list"
            site.has_batchnorm = self._container_batchnorm(value)
        return site

    def _container_batchnorm(self, value: ast.AST) -> bool | None:
        """False when no model of the literal has BatchNorm, None when some may."""
        found = [o.has_batchnorm for r, o in self.roles(value) if r == ROLE_MODELS and isinstance(o, ModelSite)]
        return False if found and not any(b is not False for b in found) else None

    def same_or_outer_block(self, stmt: ast.stmt, node: ast.AST) -> bool:
        """Is `stmt` in a block that `node` runs in too (not inside an `if` that `node` is outside)?"""
        block = self.block_of(stmt)
        cur: ast.AST | None = node
        while cur is not None:
            if cur in block:
                return True
            cur = self.parents.get(cur)
        return False

    def _model_binding(self, ref: Ref, stmt: ast.stmt, origin: Site | None, value: ast.AST | None = None) -> ModelSite:
        """The model `ref` gets from `stmt` (`value`: its part of an unpacking `a, b = x, y`)."""
        site = self.site(_assigned_value(stmt) if value is None else value, ModelSite, target=ref)
        site.stmt = stmt
        if isinstance(origin, ModelSite):
            site.class_name, site.has_batchnorm = origin.class_name, origin.has_batchnorm
        site.placements = self._placements_after(ref, stmt)
        return site

    def _values_given(self, ref: Ref) -> list[Binding]:
        """The `=` statements that bind `ref`: to the whole right-hand side, to its item of an
        unpacking (`a, b = x, y`), or to an unknown part of one (`a, b = make_pair()`)."""
        return [b for b in bindings(self).get(ref, ()) if isinstance(b.stmt, (ast.Assign, ast.AnnAssign)) and b.stmt.value is not None]

    def _assignments_to(self, ref: Ref) -> list[ast.stmt]:
        """The `=` statements that bind `ref` to their whole right-hand side, in source order."""
        return [b.stmt for b in bindings(self).get(ref, ()) if b.whole and b.assigned]

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
            and node.func.attr in DEVICE_MOVES
            and self.ref(node.func.value) == ref
        )

    def block_of(self, stmt: ast.stmt) -> list[ast.stmt]:
        """The statement list that holds `stmt` (a body, an orelse, ...)."""
        parent, field_name, _ = self.place_of(stmt)
        return getattr(parent, field_name)

    def place_of(self, stmt: ast.stmt) -> tuple[ast.AST, str, int]:
        """Where `stmt` stands: its parent, the parent's field that holds its block (body, orelse,
        handlers' body, ...) and its index in that block."""
        parent = self.parents.get(stmt, self.tree)
        for field_name, block in ast.iter_fields(parent):
            if isinstance(block, list):
                for index, item in enumerate(block):
                    if item is stmt:
                        return parent, field_name, index
        raise ValueError(f"line {stmt.lineno}: statement not found in its parent")

    def alternatives(self, site: Site) -> frozenset[Site]:
        """`site` and the sites one variable may hold instead of it, each assigned in another branch of
        one if/try/match (`if ...: loader = DataLoader(a) else: loader = DataLoader(b)`) or of a conditional expression."""
        return self._alternatives.get(site, frozenset({site}))

    @cached_property
    def _alternatives(self) -> dict[Site, frozenset[Site]]:
        branches: dict[tuple[Ref, ast.stmt], set[Site]] = defaultdict(set)
        for ref, found in bindings(self).items():
            for b in found:
                around = self.statement_binding(b.stmt) if b.value is not None else b.stmt
                chosen = around is not b.stmt and not isinstance(around, (ast.With, ast.AsyncWith))
                if chosen or isinstance(b.value, ast.IfExp):  # `loader = DataLoader(a) if ... else DataLoader(b)` too
                    branches[(ref, around)] |= {o for _, o in self.roles(b.value) if o is not None}  # type: ignore[arg-type]
        out: dict[Site, frozenset[Site]] = {}
        for sites in branches.values():
            for site in sites:
                out[site] = out.get(site, frozenset({site})) | sites
        return out

    def chosen_loaders(self, expr: ast.AST) -> list[LoaderSite]:
        """The loaders `expr` holds when they are one, or alternatives of one another (chosen in
        branches), by line; [] when none, or when it may hold unrelated ones (`run_epoch(loader)`
        called with the training and the validation loader)."""
        found = sorted(self.origins(expr, ROLE_LOADER), key=lambda s: (s.line, s.pos.col))
        return found if found and set(found) <= self.alternatives(found[0]) else []  # type: ignore[return-value]

    def refs_holding(self, origin: Site, role: str) -> set[Ref]:
        return {ref for ref, vals in self.values.items() if (role, origin) in vals}

    def enclosing(self, node: ast.AST, kinds: type | tuple[type, ...]) -> Iterator[ast.AST]:
        """Ancestors of `node` of the given node types, innermost first, within its function."""
        cur = self.parents.get(node)
        while cur is not None and not isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if isinstance(cur, kinds):
                yield cur
            cur = self.parents.get(cur)

    def runs_at_import(self, node: ast.AST) -> bool:
        """Is `node` module-level code outside the `if __name__ == "__main__":` block?"""
        if self.scope_of.get(node, MODULE_SCOPE) != MODULE_SCOPE:
            return False
        cur = self.parents.get(node)
        while cur is not None:
            if cur is self.main_guard:
                return False
            cur = self.parents.get(cur)
        return True

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

    def epoch_loops_around(self, loader: LoaderSite) -> list[LoopSite]:
        """Epoch loops whose body trains on `loader` (in a step loop here, or through a call into another file)."""
        steps = {s.node for s in (*self.step_loops, *self.delegated_steps) if s.trains and loader in s.loaders}
        return [e for e in self.epoch_loops if self.body_contains(e.node.body, lambda n: n in steps)]  # type: ignore[attr-defined]

    @property
    def has_top_level_training(self) -> bool:
        """Does module-level code (or a local function it calls) run training steps?"""
        return self.body_contains(self.tree.body, self.is_training_call)

    def forward_to_backward(self, body: list[ast.stmt]) -> tuple[int, int, ast.Call] | None:
        """In a step's statements: the index of the first one calling a model, of the one calling
        `backward()` after it, and that model call."""
        first = forward = None
        for i, stmt in enumerate(body):
            for node in ast.walk(stmt):
                if forward is None and isinstance(node, ast.Call) and self.has_role(node.func, ROLE_MODEL):
                    first, forward = i, node
                if forward is not None and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
                    return first, i, forward  # type: ignore[return-value]
        return None

    def loader_shuffles(self, loader: LoaderSite) -> bool:
        """May the loader shuffle? No only for a DataLoader call with no `shuffle` (or a literal False)
        and no `**options` that may hold one, or a call of another file's function whose loaders are
        all built so; a loader handed in from elsewhere may."""
        if loader.call is None:
            return True
        if loader.built_elsewhere:
            exported = self.facts.imported.get(self.qualname(loader.call.func) or "")
            return exported is None or not exported.unshuffled or loader.index is not None
        if any(kw.arg is None for kw in loader.call.keywords):
            return True
        shuffle = argument(loader.call, 2, "shuffle")  # DataLoader(dataset, batch_size, shuffle, ...)
        return shuffle is not None and not constant(shuffle, False)

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
    _item_sites: dict[tuple[ast.Call, int], LoaderSite]  # loaders in the tuple another file's function returns
    _model_sites: dict[ast.Call, ModelSite]


def analyze(text: str, path: str = "<string>", tree: ast.Module | None = None, pending_imports: dict[str, str] | None = None,
            facts: ProjectFacts = NO_FACTS) -> Anatomy:
    """Parse `text` (unless `tree` is given) and find its anatomy.

    `pending_imports` maps local names to qualified names for imports a codemod will add later;
    `facts` is what the file's project says about names it imports and callers it has elsewhere.
    """
    tree = ast.parse(text, filename=path) if tree is None else tree
    anatomy = Anatomy(text, path, tree, pending_imports, facts)
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
        stack += [child for child in child_nodes(node) if not isinstance(child, _NESTED_CODE)]


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_NESTED_CODE = (*_SCOPES, ast.Lambda)
# Operators and load/store contexts: leaves that ast.parse shares between nodes, so they have no
# parent, scope or statement of their own; the walk passes over them.
_SHARED_LEAVES = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """The node's children, as ast.iter_child_nodes gives them, less operators and contexts (a hot
    path: every analysis visits every node once)."""
    children = []
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, list):
            children += [item for item in value if isinstance(item, ast.AST) and not isinstance(item, _SHARED_LEAVES)]
        elif isinstance(value, ast.AST) and not isinstance(value, _SHARED_LEAVES):
            children.append(value)
    return children


class _Structure:
    """One walk of the tree, in ast.walk's order: every node, its parent, scope and statement, and
    the functions and classes with the names each function binds."""

    def __init__(self, anatomy: Anatomy) -> None:
        self.a = anatomy
        self.declared_global: dict[str, set[str]] = defaultdict(set)  # function scope -> `global`/`nonlocal` names

    def walk(self) -> None:
        a = self.a
        nodes, parents, scope_of, stmt_of, functions = a.nodes, a.parents, a.scope_of, a.stmt_of, a.functions
        todo: deque[tuple[ast.AST, str, str | None, ast.stmt | None]] = deque([(a.tree, MODULE_SCOPE, None, None)])
        while todo:
            node, scope, cls, stmt = todo.popleft()
            nodes.append(node)
            fn = functions.get(scope)
            for child in child_nodes(node):
                if fn is not None:
                    self._bind(child, fn, scope)
                parents[child] = node
                child_stmt = child if isinstance(child, ast.stmt) else stmt
                scope_of[child] = scope
                if child_stmt is not None:
                    stmt_of[child] = child_stmt
                if isinstance(child, _SCOPES):
                    todo.append((child, *self._enter(child, scope, cls), child_stmt))
                else:
                    todo.append((child, scope, cls, child_stmt))
        for scope, names in self.declared_global.items():
            a.functions[scope].locals -= names

    def _bind(self, node: ast.AST, fn: Function, scope: str) -> None:
        """A name `node` binds in the function `fn` whose code it is in: an assignment target, a nested def or class."""
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                fn.locals.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.declared_global[scope].update(node.names)
        elif isinstance(node, _SCOPES):
            fn.locals.add(node.name)

    def _enter(self, node: ast.AST, scope: str, cls: str | None) -> tuple[str, str | None]:
        if isinstance(node, ast.ClassDef):
            name = node.name if scope == MODULE_SCOPE else f"{scope}.{node.name}"
            self.a.class_of_scope[name] = name
            return name, name
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_class = cls is not None and scope == cls
            name = node.name if scope == MODULE_SCOPE else f"{scope}.{node.name}"
            self.a.functions[name] = Function(node, name, cls if in_class else None, _parameters(node))
            if in_class:
                self.a.class_of_scope[name] = cls  # type: ignore[assignment]
            return name, cls if in_class else None
        return scope, cls


class _Indexer:
    """The model classes, and the interesting calls."""

    def __init__(self, anatomy: Anatomy) -> None:
        self.a = anatomy

    def run(self) -> None:
        a = self.a
        self._collect_classes()
        a._model_sites = {}
        a._loader_sites = {}
        a._item_sites = {}
        for node in a.nodes:
            if isinstance(node, ast.Call):
                self._record_call(node)

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
                if "torch.nn.Module" in bases or bases & set(a.model_classes) or any(_imported_model_class(a, b) for b in bases):
                    a.model_classes[name] = _describe_model_class(a, node)
                    changed = True
        for mc in a.model_classes.values():  # inherited batchnorm
            for base in (a.qualname(b) for b in mc.node.bases):
                if base in a.model_classes and a.model_classes[base].has_batchnorm:
                    mc.has_batchnorm = True
                if _imported_model_class(a, base) and a.facts.imported[base].has_batchnorm:  # type: ignore[index]
                    mc.has_batchnorm = True

    def _record_call(self, call: ast.Call) -> None:
        a = self.a
        q = a.qualname(call.func) or ""
        if isinstance(call.func, ast.Name) and call.func.id in a.functions:
            q = call.func.id
        site = a.site(call, CallSite, qualname=q)
        a.calls.append(site)  # type: ignore[arg-type]
        if q == "torch.utils.data.DataLoader" or a.facts.returns(q, ROLE_LOADER):
            built_elsewhere = q != "torch.utils.data.DataLoader"
            loader = a.site(call, LoaderSite, call=call, built_elsewhere=built_elsewhere)
            a._loader_sites[call] = loader  # type: ignore[assignment]
            (a.foreign_loaders if built_elsewhere else a.loaders).append(loader)  # type: ignore[arg-type]
        elif a.is_model_constructor(q):
            mc = a.model_classes.get(q)
            imported = a.facts.imported.get(q)
            has_batchnorm = mc.has_batchnorm if mc else imported.has_batchnorm if imported else None
            model = a.site(call, ModelSite, class_name=q, has_batchnorm=has_batchnorm)
            if mc is None and q.startswith("torch.nn."):
                model.has_batchnorm = any(  # type: ignore[attr-defined]
                    isinstance(n, ast.Call) and bool(BATCHNORM.match(a.qualname(n.func) or "")) for n in ast.walk(call)
                )
            a._model_sites[call] = model  # type: ignore[assignment]
        self._record_returned_loaders(call, q)

    def _record_returned_loaders(self, call: ast.Call, q: str) -> None:
        """A stand-in site for each loader in the tuple that a function of another file returns."""
        a = self.a
        exported = a.facts.imported.get(q)
        for index, roles in enumerate(exported.items if exported else ()):
            if ROLE_LOADER in roles:
                loader = a.site(call, LoaderSite, call=call, built_elsewhere=True, index=index)
                a._item_sites[(call, index)] = loader  # type: ignore[assignment]
                a.foreign_loaders.append(loader)  # type: ignore[arg-type]


def _imported_model_class(a: Anatomy, qualname: str | None) -> bool:
    imported = a.facts.imported.get(qualname or "")
    return imported is not None and imported.is_model_class


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
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call) and a.qualname(sub.value.func) == PARAMETER_CONSTRUCTOR:
            mc.parameters.update(t.attr for t in sub.targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self")
        if isinstance(sub, ast.Assign) and _is_repeated_blocks(a, sub.value):
            mc.block_lists += [t.attr for t in sub.targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"]
        if isinstance(sub, ast.Call) and BATCHNORM.match(a.qualname(sub.func) or ""):
            mc.has_batchnorm = True
    return mc


def _is_repeated_blocks(a: Anatomy, value: ast.expr) -> bool:
    """`nn.ModuleList`/`nn.Sequential` of blocks built by a comprehension or of one repeated class:
    the units FSDP shards one by one."""
    if not (isinstance(value, ast.Call) and a.qualname(value.func) in BLOCK_SEQUENCES):
        return False
    items = [arg.value if isinstance(arg, ast.Starred) else arg for arg in value.args]
    if len(items) == 1 and isinstance(items[0], (ast.ListComp, ast.GeneratorExp)):
        return True
    elements = items[0].elts if len(items) == 1 and isinstance(items[0], (ast.List, ast.Tuple)) else items
    classes = {a.qualname(e.func) for e in elements if isinstance(e, ast.Call)}
    return len(elements) >= 2 and len(classes) == 1 and all(isinstance(e, ast.Call) for e in elements)


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = fn.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names.update(a.arg for a in (args.vararg, args.kwarg) if a)
    return names


class _ValueFlow:
    """Propagate roles through assignments, arguments and returns until nothing changes."""

    MAX_ROUNDS = 8

    def __init__(self, anatomy: Anatomy) -> None:
        self.a = anatomy
        self.assignments = [n for n in anatomy.nodes if isinstance(n, (ast.Assign, ast.AnnAssign, ast.withitem, ast.NamedExpr))]
        self.returns = [n for n in anatomy.nodes if isinstance(n, ast.Return) and n.value is not None]
        self.local_calls = [c for c in anatomy.calls if anatomy.callee(c.node) is not None]  # type: ignore[arg-type]

    def run(self) -> None:
        self._seed_incoming()
        self._flow()
        if self._seed_trained_models():
            self._flow()
        self._bind_origins()

    def _flow(self) -> None:
        for _ in range(self.MAX_ROUNDS):
            before = self._known()
            self._flow_assignments()
            self._flow_arguments()
            self._flow_returns()
            if self._known() == before:
                break

    def _seed_trained_models(self) -> bool:
        """A variable whose `.parameters()` an optimizer is built on holds a model, even where no
        constructor says so (`models.__dict__[arch]()`, `getattr(models, arch)()`, `torch.hub.load`,
        a library's `build_model(cfg)`): a model of unknown class. True when one was found."""
        a, seeded = self.a, False
        for optimizer in a.optimizers:
            for node in a._walk_through_variables(optimizer.node):
                receiver = _parameters_receiver(node)
                ref = a.ref(receiver) if receiver is not None else None
                if ref is not None and not a.roles(receiver):
                    a.values[ref].add((ROLE_MODEL, None))
                    seeded = True
        return seeded

    def _known(self) -> int:
        a = self.a
        return sum(len(v) for table in (a.values, a.returns, a.item_returns) for v in table.values())  # type: ignore[attr-defined]

    def _seed_incoming(self) -> None:
        """Parameters that callers in other files fill: a stand-in site for each model or loader."""
        a = self.a
        for scope, params in a.facts.params.items():
            fn = a.functions.get(scope)
            if fn is None:
                continue
            for param, incoming in params.items():
                ref = Ref(scope, param)
                for role in incoming.roles:
                    a.values[ref].add((role, self._stand_in(fn, ref, role, incoming)))

    def _stand_in(self, fn: Function, ref: Ref, role: str, incoming) -> Site | None:
        a = self.a
        if role == ROLE_LOADER:
            loader = a.site(fn.node, LoaderSite, target=ref, built_elsewhere=True, handled_elsewhere=True)
            a.foreign_loaders.append(loader)  # type: ignore[arg-type]
            return loader
        if role == ROLE_MODEL:
            model = a.site(fn.node, ModelSite, target=ref, has_batchnorm=incoming.has_batchnorm)
            a.foreign_models.append(model)  # type: ignore[arg-type]
            if incoming.wrapped:
                a.wrapped_elsewhere.add(model)  # type: ignore[arg-type]
            return model
        return None

    def _flow_assignments(self) -> None:
        for node in self.assignments:
            for target, value in _assigned_pairs(node):
                ref = self.a.ref(target)
                if ref is not None:
                    self.a.values[ref] |= self.a.roles(value)
        for target, container in self.a._loop_targets:
            ref = self.a.ref(target)
            if ref is not None:
                self.a.values[ref] |= {(ROLE_MODEL, o) for r, o in self.a.roles(container) if r == ROLE_MODELS}

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
            if isinstance(ret.value, ast.Tuple):
                for index, item in enumerate(ret.value.elts):
                    self.a.item_returns[(scope, index)] |= self.a.roles(item)

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


def any_batchnorm(values: Iterable[bool | None]) -> bool | None:
    """True if any model may have BatchNorm, False if none has, None when unknown."""
    seen = set(values)
    if True in seen:
        return True
    return False if seen == {False} else None


def _parameters_receiver(node: ast.AST) -> ast.AST | None:
    """`model` in `model.parameters()` / `model.named_parameters()` (a variable, not `model.head`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PARAMETER_METHODS:
        receiver = node.func.value
        if isinstance(receiver, ast.Name) or (isinstance(receiver, ast.Attribute) and isinstance(receiver.value, ast.Name)
                                              and receiver.value.id == "self"):
            return receiver
    return None


def _assigned_pairs(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    return [pair for target, value in _assignment(node) for pair in _unpacked(target, value)]


def _unpacked(target: ast.AST, value: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """`a, b = x, y` pairs each name with its value; `a, b = f()` with `f()[0]`, `f()[1]` (an ast not in the tree)."""
    if not isinstance(target, (ast.Tuple, ast.List)):
        return [(target, value)]
    if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
        return [pair for t, v in zip(target.elts, value.elts) for pair in _unpacked(t, v)]
    if isinstance(value, ast.Call) and not any(isinstance(t, ast.Starred) for t in target.elts):
        return [(t, ast.Subscript(value=value, slice=ast.Constant(i), ctx=ast.Load())) for i, t in enumerate(target.elts)]
    return []


def _int_constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _assignment(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    if isinstance(node, ast.Assign):
        return [(t, node.value) for t in node.targets]
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return [(node.target, node.value)]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [(node.optional_vars, node.context_expr)]
    if isinstance(node, ast.NamedExpr):
        return [(node.target, node.value)]
    return []


def _moves_any(expr: ast.AST) -> bool:
    """Does the expression call `.to(...)` or `.cuda(...)` anywhere?"""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in DEVICE_MOVES for n in ast.walk(expr))


def _reads_name(expr: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))


def _updates_in_place(body: list[ast.stmt], name: str) -> bool:
    """Does the loop body change `name` in place from its gradient (`name -= ...`, `name.data.add_(...)`)?"""
    for node in walk_body(body):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("add_", "sub_", "copy_"):
            receiver = node.func.value
            receiver = receiver.value if isinstance(receiver, ast.Attribute) and receiver.attr == "data" else receiver
            if isinstance(receiver, ast.Name) and receiver.id == name and _reads_name(node, name) and any(
                isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(node)
            ):
                return True
    return False


def _container_iterated(expr: ast.AST) -> ast.AST | None:
    """`nets` in `for x in nets` and `for x in nets.values()`."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "values" and not expr.args:
        expr = expr.func.value
    return expr if isinstance(expr, (ast.Name, ast.Attribute)) else None


def _assigned_value(stmt: ast.stmt) -> ast.AST:
    return stmt.value  # type: ignore[attr-defined, return-value]


def _argument_for(call: ast.Call, index: int, name: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return call.args[index] if index < len(call.args) else None


def _direct_origins(a: Anatomy, value: ast.AST) -> list[Site]:
    """Sites constructed by the expression itself (through `.to()`/`.cuda()` chains)."""
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Call) and _int_constant(value.slice):
        site = a._item_sites.get((value.value, value.slice.value))  # type: ignore[attr-defined]
        return [site] if site is not None else []
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
    for node in a.nodes:
        if not isinstance(node, (ast.For, ast.AsyncFor)):
            continue
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
    for node in a.nodes:
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and node not in {l.node for l in a.step_loops}:
            if a.body_contains(node.body, lambda n: n in train_loop_nodes):
                a.epoch_loops.append(a.site(node, LoopSite, loop_var=_loop_var(node), trains=True))  # type: ignore[arg-type]


def _find_iterator_passes(a: Anatomy) -> None:
    """`data_iter = iter(loader)` whose `next(data_iter)` a training loop draws its batches from, and
    `iter(loader)` inside a training loop (a restart on StopIteration, or `next(iter(loader))` each
    step): the loader feeds training, one pass per `iter()` call."""
    for node in a.nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "iter" and len(node.args) == 1):
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
    for node in a.nodes:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next" and node.args
                and a.ref(node.args[0]) == ref and ref is not None):
            if any(a.body_contains(lp.body, a.is_training_call) for lp in a.enclosing(node, (ast.For, ast.While))):
                return True
    return False


def _find_delegated_training(a: Anatomy) -> None:
    """Loaders of this file that another file trains on: handed to its function, or returned to it."""
    for call in a.calls:
        exported = a.facts.imported.get(call.qualname)
        for param, mode in exported.trains if exported else ():
            arg = _argument_for(call.node, exported.params.index(param), param)  # type: ignore[arg-type, union-attr]
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
    if isinstance(expr, ast.Call) and expr in a._loader_sites:
        return [a._loader_sites[expr]]
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
