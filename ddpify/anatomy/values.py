"""What the values of one script are: the roles (model, loader, optimizer, ...) each variable, call and
return holds, with the sites they come from, and which of the script's own functions a call runs.

`ScriptValues` is the second layer of an `Anatomy`, on top of `ScriptTree`; the index
(ddpify.anatomy.index) and the value flow (ddpify.anatomy.value_flow) fill its tables.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Iterator

from ddpify.anatomy.bindings import Binding, bindings
from ddpify.anatomy.facts import NO_FACTS, ProjectFacts
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite, LoaderSite, ModelSite, Ref, Site
from ddpify.anatomy.tree import ScriptTree, walk_body
from ddpify.anatomy.vocabulary import (
    MODEL_WRAPPERS,
    MODULE_RETURNING_SELF,
    TQDM_CONSTRUCTORS,
    WRITER_CONSTRUCTORS,
    is_builtin_layer,
    is_criterion_class,
    is_model_factory,
    is_optimizer_constructor,
    is_scheduler_constructor,
)

_FILLING_METHODS = ("append", "extend")

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

MODEL_KEEPING_METHODS = MODULE_RETURNING_SELF | {"module"}  # `model.module` is the model too


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


class ScriptValues(ScriptTree):
    """What each expression of one script evaluates to, as far as training goes."""

    def __init__(self, text: str, path: str, tree: ast.Module, pending_imports: dict[str, str] | None = None,
                 facts: ProjectFacts = NO_FACTS) -> None:
        super().__init__(text, path, tree, pending_imports)
        self.facts = facts
        self.model_classes: dict[str, ModelClass] = {}
        self.values: dict[Ref, set[tuple[str, Site | None]]] = defaultdict(set)
        self.returns: dict[str, set[tuple[str, Site | None]]] = defaultdict(set)
        self.item_returns: dict[tuple[str, int], set[tuple[str, Site | None]]] = defaultdict(set)  # `return a, b`
        self.calls: list[CallSite] = []
        self.models: list[ModelSite] = []
        self.loaders: list[LoaderSite] = []  # the DataLoader calls of this file
        self.foreign_loaders: list[LoaderSite] = []  # stand-ins for loaders other files build (ddpify.anatomy.project)
        self.foreign_models: list[ModelSite] = []  # stand-ins for models other files hand in (ddpify.anatomy.project)
        self.wrapped_elsewhere: set[ModelSite] = set()  # models that arrive already wrapped in DDP
        self.loader_sites: dict[ast.Call, LoaderSite] = {}
        self.item_sites: dict[tuple[ast.Call, int], LoaderSite] = {}  # loaders in the tuple another file's function returns
        self.model_sites: dict[ast.Call, ModelSite] = {}
        self._callees: dict[ast.Call, str | None] = {}  # asked of the same calls by every pass, rule and transform
        self._instance_calls: dict[Ref, str | None] = {}  # what calling each variable runs, when it holds an instance
        self._settled_roles: dict[ast.AST, set[tuple[str, Site | None]]] | None = None  # once the value flow is done
        self._walked: dict[str, list[ast.AST]] = {}  # the nodes of each function's body, walk_body's order

    # ----- roles ------------------------------------------------------------------------------
    def settle_values(self) -> None:
        """The value flow is done: what each expression evaluates to is remembered from now on."""
        self._settled_roles = {}

    def roles(self, expr: ast.AST) -> set[tuple[str, Site | None]]:
        """What an expression evaluates to: (role, origin site) pairs."""
        return set(self._roles_of(expr))

    def _roles_of(self, expr: ast.AST) -> set[tuple[str, Site | None]]:
        """`roles(expr)`, not to be changed: remembered once the values are settled."""
        settled = self._settled_roles
        if settled is None:
            return self._find_roles(expr)
        if expr not in settled:
            settled[expr] = self._find_roles(expr)
        return settled[expr]

    def _find_roles(self, expr: ast.AST) -> set[tuple[str, Site | None]]:
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
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Call) and int_constant(expr.slice):
            return self._item_roles(expr.value, expr.slice.value)  # type: ignore[attr-defined]
        return set()

    def _is_model_registry(self, expr: ast.AST) -> bool:
        """`MODELS` in `MODELS[name](...)`: a module-level dict or list literal of model classes only."""
        if not isinstance(expr, ast.Name):
            return False
        assigns = self._assignments_to(Ref(MODULE_SCOPE, expr.id))
        value = assigned_value(assigns[-1]) if len(assigns) == 1 else None
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
        return {(role, self.item_sites.get((call, index)) if role == ROLE_LOADER else None) for role in exported.items[index]}

    def has_role(self, expr: ast.AST, role: str) -> bool:
        return any(r == role for r, _ in self._roles_of(expr))

    def origins(self, expr: ast.AST, role: str) -> set[Site]:
        return {o for r, o in self._roles_of(expr) if r == role and o is not None}

    def _call_roles(self, call: ast.Call) -> set[tuple[str, Site | None]]:
        q = self.qualname(call.func) or ""
        site = self._constructor_site(call, q)
        if site is not None:
            return {site}
        if q in TQDM_CONSTRUCTORS and call.args:
            return self.roles(call.args[0]) | {(ROLE_PBAR, None)}
        if isinstance(call.func, ast.Attribute) and call.func.attr in MODEL_KEEPING_METHODS:
            return {r for r in self.roles(call.func.value) if r[0] == ROLE_MODEL}
        if isinstance(call.func, ast.Subscript) and self._is_model_registry(call.func.value):
            return {(ROLE_MODEL, None)}
        callee = self.callee(call)
        if callee is not None:
            return set(self.returns.get(callee, ()))
        imported = self.facts.imported.get(q)
        return {(role, None) for role in imported.roles} if imported else set()

    def _first_model_origin(self, expr: ast.AST) -> Site | None:
        """The model `expr` holds that is built first in the file, in no set's order (a run's memory
        addresses ordered them, so a wrapper of `model` from an if/elif chain got a different model, or
        none, from run to run)."""
        return min(self.origins(expr, ROLE_MODEL), key=lambda s: (s.line, s.pos.col), default=None)

    def _constructor_site(self, call: ast.Call, q: str) -> tuple[str, Site | None] | None:
        if q == "torch.utils.data.DataLoader" or self.facts.returns(q, ROLE_LOADER):
            return ROLE_LOADER, self.loader_sites.get(call)
        if self.is_model_constructor(q):
            return ROLE_MODEL, self.model_sites.get(call)
        if q in MODEL_WRAPPERS and call.args:
            return ROLE_MODEL, self._first_model_origin(call.args[0])
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

    def refs_holding(self, origin: Site, role: str) -> set[Ref]:
        return {ref for ref, vals in self.values.items() if (role, origin) in vals}

    # ----- calls ------------------------------------------------------------------------------
    def callee(self, call: ast.Call) -> str | None:
        """The scope name of a function this file defines that `call` invokes."""
        if call not in self._callees:
            self._callees[call] = self._find_callee(call)
        return self._callees[call]

    def _find_callee(self, call: ast.Call) -> str | None:
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
        if ref is None:
            return None
        if ref not in self._instance_calls:
            self._instance_calls[ref] = self._called_method(ref)
        return self._instance_calls[ref]

    def _called_method(self, ref: Ref) -> str | None:
        """The `__call__` of the one local class whose instances alone `ref` is ever given, if it defines one."""
        values = [assigned_value(s) for s in self._assignments_to(ref)]
        classes = {v.func.id if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) else None for v in values}
        if len(classes) != 1 or None in classes:
            return None
        method = f"{classes.pop()}.__call__"
        return method if method in self.functions else None

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

    def function_contains(self, scope: str, predicate, _seen: set[str] | None = None) -> bool:
        """Does function `scope`, or anything it calls, contain a node matching predicate?"""
        seen = set() if _seen is None else _seen
        if scope in seen or scope not in self.functions:
            return False
        seen.add(scope)
        return self._any_reaches(self._function_nodes(scope), predicate, seen)

    def body_contains(self, body: Iterable[ast.AST], predicate, _seen: set[str] | None = None) -> bool:
        return self._any_reaches(walk_body(body), predicate, set() if _seen is None else _seen)

    def _any_reaches(self, nodes: Iterable[ast.AST], predicate, seen: set[str]) -> bool:
        """Does one of `nodes`, or a function of this file they call (not in `seen`), match predicate?"""
        for node in nodes:
            if predicate(node):
                return True
            if isinstance(node, ast.Call):
                callee = self.callee(node)
                if callee and self.function_contains(callee, predicate, seen):
                    return True
        return False

    def _function_nodes(self, scope: str) -> list[ast.AST]:
        """`walk_body` of a function's body, walked once (function_contains asks it again and again)."""
        nodes = self._walked.get(scope)
        if nodes is None:
            nodes = self._walked[scope] = list(walk_body(self.functions[scope].node.body))
        return nodes

    @cached_property
    def optimizers(self) -> list[CallSite]:
        """Every optimizer construction (`torch.optim.SGD(...)`, or another project file's builder), in source order."""
        return [c for c in self.calls if self._builds_optimizer(c.qualname)]

    def _builds_optimizer(self, qualname: str) -> bool:
        """`torch.optim.SGD(...)`, or a function of another project file that returns an optimizer."""
        return is_optimizer_constructor(qualname) or self.facts.returns(qualname, ROLE_OPTIMIZER)

    @cached_property
    def training_calls(self) -> list[CallSite]:
        """`loss.backward()`, `optimizer.step()`, `scaler.step(...)`: where the script trains."""
        return [c for c in self.calls if self.is_training_call(c.node)]

    @property
    def trains(self) -> bool:
        """Does the script train anything (an optimizer, or a backward pass)?"""
        return bool(self.optimizers or self.training_calls)

    def is_training_call(self, node: ast.AST) -> bool:
        """`loss.backward()`, `optimizer.step()` or `scaler.step(optimizer)`."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return False
        attr = node.func.attr
        if attr == "backward":
            return True
        return attr == "step" and (self.has_role(node.func.value, ROLE_OPTIMIZER) or self.has_role(node.func.value, ROLE_SCALER))

    # ----- what variables are given ----------------------------------------------------------
    def _values_given(self, ref: Ref) -> list[Binding]:
        """The `=` statements that bind `ref`: to the whole right-hand side, to its item of an
        unpacking (`a, b = x, y`), or to an unknown part of one (`a, b = make_pair()`)."""
        return [b for b in bindings(self).get(ref, ()) if isinstance(b.stmt, (ast.Assign, ast.AnnAssign)) and b.stmt.value is not None]

    def _assignments_to(self, ref: Ref) -> list[ast.stmt]:
        """The `=` statements that bind `ref` to their whole right-hand side, in source order."""
        return [b.stmt for b in bindings(self).get(ref, ()) if b.whole and b.assigned]

    def walk_through_variables(self, expr: ast.AST, depth: int = 0) -> Iterator[ast.AST]:
        """Nodes of `expr`, and of the values its local variables were last given (`groups = [...]`)."""
        for node in ast.walk(expr):
            yield node
            ref = self.ref(node) if isinstance(node, ast.Name) and depth < 3 else None
            if ref is None or ref.scope != self.scope_of.get(node, MODULE_SCOPE) or self.roles(node):
                continue
            earlier = [s for s in self._assignments_to(ref) if s.lineno <= node.lineno]
            if earlier:
                yield from self.walk_through_variables(assigned_value(earlier[-1]), depth + 1)
            for value in self._filled_into(ref, node):
                yield from self.walk_through_variables(value, depth + 1)

    def _filled_into(self, ref: Ref, used_at: ast.Name) -> Iterator[ast.AST]:
        """What a list is filled with before `used_at` (`biases.append(param)`), and what a loop
        variable walks (`model.named_parameters()` for `param`): SSD's parameter groups."""
        for b in bindings(self).get(ref, ()):
            if isinstance(b.stmt, (ast.For, ast.AsyncFor)) and b.stmt.lineno <= used_at.lineno:
                yield b.stmt.iter
        for call in self.calls:
            func = call.node.func  # type: ignore[attr-defined]
            if (call.line <= used_at.lineno and isinstance(func, ast.Attribute) and func.attr in _FILLING_METHODS
                    and isinstance(func.value, ast.Name) and self.ref(func.value) == ref):
                yield from call.node.args  # type: ignore[attr-defined]

    @cached_property
    def loop_targets(self) -> list[tuple[ast.AST, ast.AST]]:
        """(loop variable, the list or dict it walks) of every for loop and comprehension."""
        found = []
        for node in self.nodes_of(ast.For, ast.comprehension):
            container = _container_iterated(node.iter)  # type: ignore[attr-defined]
            if container is not None:
                found.append((node.target, container))  # type: ignore[attr-defined]
        return found

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


def _container_iterated(expr: ast.AST) -> ast.AST | None:
    """`nets` in `for x in nets` and `for x in nets.values()`."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "values" and not expr.args:
        expr = expr.func.value
    return expr if isinstance(expr, (ast.Name, ast.Attribute)) else None


def int_constant(node: ast.AST) -> bool:
    """Is `node` an integer literal (not a bool)?"""
    return isinstance(node, ast.Constant) and type(node.value) is int


def assigned_value(stmt: ast.stmt) -> ast.AST:
    """The right-hand side of an `=` statement."""
    return stmt.value  # type: ignore[attr-defined, return-value]


def argument_for(call: ast.Call, index: int, name: str) -> ast.AST | None:
    """What `call` passes for parameter `name`, by keyword or at position `index`."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return call.args[index] if index < len(call.args) else None
