"""Which models a script trains, the statement that binds each where the wrap must follow, and whether
it reaches its device there (or in a function or method it is handed to).

`TrainedModels` is the third layer of an `Anatomy`, on top of `ScriptValues`.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cached_property
from typing import Callable, Iterable, Iterator

from ddpify.anatomy.bindings import Binding
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite, ModelSite, Ref, Site
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.values import ROLE_MODEL, ROLE_MODELS, ScriptValues, argument_for, assigned_value
from ddpify.anatomy.vocabulary import DEVICE_MOVES, DTYPE_CASTS, FLOAT_DTYPES, PARAMETER_METHODS

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


class TrainedModels(ScriptValues):
    """The models an optimizer (or a hand-written update) trains, each where it is bound and moved."""

    # ----- the trained models ----------------------------------------------------------------
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
            for node in self.walk_through_variables(call.node):
                if isinstance(node, (ast.Name, ast.Attribute)):
                    yield node, call.node
        if not self.optimizers:
            for loop, receiver in self._manual_update_loops():
                yield receiver, loop

    @cached_property
    def optimizers_without_model(self) -> list[CallSite]:
        """Optimizers whose parameters come from no model the analysis can bind (nothing to wrap)."""
        return [c for c in self.optimizers if not self._models_trained_by(c) and not self._reads_incoming_model(c)]

    def _reads_incoming_model(self, optimizer: CallSite) -> bool:
        """Does the optimizer read a parameter that another project file fills with a model (that file binds and wraps it)?"""
        incoming = self.facts.params.get(optimizer.scope, {})
        return any(isinstance(n, ast.Name) and n.id in incoming and ROLE_MODEL in incoming[n.id].roles for n in ast.walk(optimizer.node))

    def _models_trained_by(self, optimizer: CallSite) -> list[ModelSite]:
        """The model bindings whose parameters `optimizer` reads (through the variables it is built from)."""
        found: dict[Ref, ModelSite] = {}
        for node in self.walk_through_variables(optimizer.node):
            ref = self.ref(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if ref is None or ref in found or not self.has_role(node, ROLE_MODEL):
                continue
            binding = self._binding(ref, optimizer.node)
            if binding is not None:
                found[ref] = binding
        return list(found.values())

    def _manual_update_loops(self) -> Iterator[tuple[ast.For, ast.AST]]:
        """`for p in model.parameters(): p.data.add_(-lr * p.grad)` (or `p -= lr * p.grad`): (loop, model)."""
        for node in self.nodes_of(ast.For):
            if not (isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Call)):
                continue
            func = node.iter.func
            if isinstance(func, ast.Attribute) and func.attr == "parameters" and _updates_in_place(node.body, node.target.id):
                yield node, func.value

    # ----- where a model reaches its device --------------------------------------------------
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
                    arg = argument_for(call, index, param)
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
        values = [assigned_value(s) for s in self._assignments_to(ref)] if ref is not None else []
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

    def _set_up_after(self, ref: Ref, stmt: ast.stmt, changes: Callable[[ast.AST, Ref], bool]) -> list[ast.stmt]:
        """Statements after `stmt` in its block, before the first loop (other than one over the model's
        own parameters, which sorts them into groups), holding a call that `changes` `ref`'s model."""
        block = self.block_of(stmt)
        out = []
        for later in block[block.index(stmt) + 1:]:
            if isinstance(later, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.ClassDef)) and not self._walks_parameters(later, ref):
                break
            if any(changes(node, ref) for node in ast.walk(later)):
                out.append(later)
        return out

    def _walks_parameters(self, loop: ast.stmt, ref: Ref) -> bool:
        """`for name, param in model.named_parameters():` (or `.parameters()`) over `ref`'s model."""
        call = getattr(loop, "iter", None)
        return (
            isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in PARAMETER_METHODS and self.ref(call.func.value) == ref
        )

    def _moves(self, node: ast.AST, ref: Ref) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in DEVICE_MOVES
            and self.ref(node.func.value) == ref
        )

    def _casts(self, node: ast.AST, ref: Ref) -> bool:
        return self.is_dtype_cast(node) and self.ref(node.func.value) == ref  # type: ignore[attr-defined]

    def is_dtype_cast(self, node: ast.AST) -> bool:
        """`x.double()`, `x.half()`, `x.type(torch.float64)`, `x.to(device, torch.float64)`: a module's cast of
        its parameters to another dtype (on a tensor, the same calls cast the tensor)."""
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
            node.func.attr in DTYPE_CASTS or node.func.attr in DEVICE_MOVES and self._names_dtype(node))

    def _names_dtype(self, call: ast.Call) -> bool:
        """Does the call pass a dtype (`dtype=`, or `torch.float64` among its arguments)?"""
        return any(kw.arg == "dtype" for kw in call.keywords) or any(self.qualname(arg) in FLOAT_DTYPES for arg in call.args)

    # ----- casts after the wrap --------------------------------------------------------------
    def casts_while_training(self, site: ModelSite) -> list[ast.Call]:
        """The casts of `site`'s parameters to another dtype past where it is set up (`ready_at`, where the
        wrap goes) that training still follows: in a loop that trains, or before a later backward or
        optimizer step of its function. A wrap cannot go after them; one before them keeps the old dtype."""
        ready = site.ready_at
        after = [n for n in self.nodes_of(ast.Call) if self._casts(n, site.target)
                 and n.lineno > (ready.end_lineno or ready.lineno)]
        return [call for call in after if self.trains_after(self.stmt_of[call])]

    def trains_after(self, stmt: ast.stmt) -> bool:
        """Does a training call run after `stmt`: a loop around it trains, or what follows it in its function does?"""
        if any(self.body_contains(loop.body, self.is_training_call) for loop in self.enclosing(stmt, _LOOPS)):
            return True
        for node in (stmt, *self.enclosing(stmt, ast.stmt)):
            block = self.block_of(node)
            if self.body_contains(block[block.index(node) + 1:], self.is_training_call):
                return True
        return False

    # ----- the statement that binds a model --------------------------------------------------
    def _binding(self, ref: Ref, used_at: ast.AST, depth: int = 0) -> ModelSite | None:
        """The statement that gives `ref` its model, following function parameters to callers: the
        last assignment on the way to `used_at`, or the if/try/with/match whose branches assign it
        (`if arch == "a": model = A() else: model = B()`: one variable, bound once the branches end)."""
        given = self._reaching_bindings(ref, used_at)
        if given and not ref.name.startswith("self."):
            given = self._every_branch_binding(ref, given)
        if given:
            stmt = self.statement_binding(given[-1].stmt, None if ref.name.startswith("self.") else used_at)
            if stmt is None:  # used inside one of the branches: bound once they end
                stmt = self.statement_binding(given[-1].stmt)
            if stmt is given[-1].stmt:
                value = given[-1].value
                origins = self.origins(value, ROLE_MODEL) if value is not None else set()
                if len(origins) > 1:  # `model = a or b`: every origin counts, in no set's order
                    return self._inherit(self._model_binding(ref, stmt, None, value), origins)  # type: ignore[arg-type]
                return self._model_binding(ref, stmt, next(iter(origins), None), value)  # type: ignore[arg-type]
            return self._branches_binding(ref, stmt, given)  # type: ignore[arg-type]
        container = self._iterated_container(ref)
        if container is not None:
            return self._container_binding(container, used_at, depth)
        fn = self.functions.get(ref.scope)
        if fn is None or ref.name not in fn.params or depth > 5:
            return None
        for site in self.calls:
            if self.callee(site.node) == ref.scope:  # type: ignore[arg-type]
                arg = argument_for(site.node, fn.params.index(ref.name), ref.name)  # type: ignore[arg-type]
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

    def _every_branch_binding(self, ref: Ref, given: list[Binding]) -> list[Binding]:
        """`given`, or every binding of `ref` in the if/try around it when another branch binds it too
        (`if checkpoint is None: model = SSD300(); optimizer = ... else: model = checkpoint["model"]`):
        the model is one variable, bound (and wrapped) once the branches end."""
        around = self.statement_binding(given[-1].stmt)
        if around is given[-1].stmt:
            return given
        inside = [b for b in self._values_given(ref) if self._holds(around, b.stmt)]
        return inside if len({self.place_of(b.stmt)[:2] for b in inside}) > 1 else given

    def _branches_binding(self, ref: Ref, stmt: ast.stmt, given: list[Binding]) -> ModelSite:
        """The model `ref` gets in the branches of `stmt`: wrapped once, after it (and after its moves)."""
        origins = [o for b in given if b.value is not None for r, o in self.roles(b.value) if r == ROLE_MODEL]
        return self._inherit(self._model_binding(ref, stmt, None, stmt), origins)

    @staticmethod
    def _inherit(site: ModelSite, origins: Iterable[Site]) -> ModelSite:
        """`site` with the class its origins share (else none) and BatchNorm if any of them may hold it."""
        origins = list(origins)
        classes = {o.class_name if isinstance(o, ModelSite) else "" for o in origins}
        site.class_name = classes.pop() if len(classes) == 1 else ""
        site.has_batchnorm = any_batchnorm(o.has_batchnorm if isinstance(o, ModelSite) else None for o in origins)
        return site

    def _iterated_container(self, ref: Ref) -> ast.AST | None:
        """`nets` when `ref` is the variable of `for net in nets` / `... for net in nets.values()`."""
        for target, element_of in self.loop_targets:
            if isinstance(target, ast.Name) and target.id == ref.name and self.ref(target) == ref:
                return element_of
        return None

    def _container_binding(self, container: ast.AST, used_at: ast.AST, depth: int) -> ModelSite | None:
        ref = self.ref(container, self.scope_of.get(used_at, MODULE_SCOPE))
        if ref is None or not self.has_role(container, ROLE_MODELS):
            return None
        site = self._binding(ref, used_at, depth + 1)
        if site is not None:
            value = assigned_value(site.stmt)
            site.container = "dict" if isinstance(value, ast.Dict) else "list"
            site.has_batchnorm = self._container_batchnorm(value)
        return site

    def _container_batchnorm(self, value: ast.AST) -> bool | None:
        """False when no model of the literal has BatchNorm, None when some may."""
        found = [o.has_batchnorm for r, o in self.roles(value) if r == ROLE_MODELS and isinstance(o, ModelSite)]
        return False if found and not any(b is not False for b in found) else None

    def _model_binding(self, ref: Ref, stmt: ast.stmt, origin: Site | None, value: ast.AST | None = None) -> ModelSite:
        """The model `ref` gets from `stmt` (`value`: its part of an unpacking `a, b = x, y`)."""
        site = self.site(assigned_value(stmt) if value is None else value, ModelSite, target=ref)
        site.stmt = stmt
        if isinstance(origin, ModelSite):
            site.class_name, site.has_batchnorm = origin.class_name, origin.has_batchnorm
        site.placements = self._set_up_after(ref, stmt, self._moves)
        site.casts = self._set_up_after(ref, stmt, self._casts)
        return site


def any_batchnorm(values: Iterable[bool | None]) -> bool | None:
    """True if any model may have BatchNorm, False if none has, None when unknown."""
    seen = set(values)
    if True in seen:
        return True
    return False if seen == {False} else None


def _moves_any(expr: ast.AST) -> bool:
    """Does the expression call `.to(...)` or `.cuda(...)` anywhere?"""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in DEVICE_MOVES for n in ast.walk(expr))


def _reads_name(expr: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))


def variable_updated(target: ast.AST) -> str | None:
    """`p` in `p -= ...` and in `p.data -= ...`."""
    target = target.value if isinstance(target, ast.Attribute) and target.attr == "data" else target
    return target.id if isinstance(target, ast.Name) else None


def _updates_in_place(body: list[ast.stmt], name: str) -> bool:
    """Does the loop body change `name` in place from its gradient (`name -= ...`, `name.data.add_(...)`)?"""
    for node in walk_body(body):
        if isinstance(node, ast.AugAssign) and variable_updated(node.target) == name:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("add_", "sub_", "copy_"):
            receiver = node.func.value
            receiver = receiver.value if isinstance(receiver, ast.Attribute) and receiver.attr == "data" else receiver
            if isinstance(receiver, ast.Name) and receiver.id == name and _reads_name(node, name) and any(
                isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(node)
            ):
                return True
    return False
