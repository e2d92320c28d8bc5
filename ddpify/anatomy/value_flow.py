"""The value-flow pass of the analysis: roles carried through assignments, arguments and return values
until nothing changes, so a model built in `main()` and handed to `train_one_epoch(model, ...)` is the
same model there; then each model and loader site learns the variable it is first bound to."""

from __future__ import annotations

import ast

from ddpify.anatomy.sites import MODULE_SCOPE, LoaderSite, ModelSite, Ref, Site
from ddpify.anatomy.tree import Function
from ddpify.anatomy.values import (
    MODEL_KEEPING_METHODS,
    ROLE_LOADER,
    ROLE_MODEL,
    ROLE_MODELS,
    ScriptValues,
    int_constant,
)
from ddpify.anatomy.vocabulary import PARAMETER_METHODS


def flow_values(anatomy: ScriptValues) -> None:
    """Fill the anatomy's values, returns and item returns, and bind its model and loader sites."""
    _ValueFlow(anatomy).run()


class _ValueFlow:
    """Propagate roles through assignments, arguments and returns until nothing changes."""

    MAX_ROUNDS = 8

    def __init__(self, anatomy: ScriptValues) -> None:
        self.a = anatomy
        self.assignments = anatomy.nodes_of(ast.Assign, ast.AnnAssign, ast.withitem, ast.NamedExpr)
        self.returns = [n for n in anatomy.nodes_of(ast.Return) if n.value is not None]
        self.local_calls = [c for c in anatomy.calls if anatomy.callee(c.node) is not None]  # type: ignore[arg-type]

    def run(self) -> None:
        self._seed_incoming()
        self._flow()
        if self._seed_trained_models():
            self._flow()
        self._bind_origins()
        self.a.settle_values()

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
            for node in a.walk_through_variables(optimizer.node):
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
        for target, container in self.a.loop_targets:
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
        a.models = [m for m in a.model_sites.values() if m.target is not None and m.target.scope not in a.model_classes]


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


def _direct_origins(a: ScriptValues, value: ast.AST) -> list[Site]:
    """Sites constructed by the expression itself (through `.to()`/`.cuda()` chains)."""
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Call) and int_constant(value.slice):
        site = a.item_sites.get((value.value, value.slice.value))  # type: ignore[attr-defined]
        return [site] if site is not None else []
    while isinstance(value, ast.Call):
        site = a.model_sites.get(value) or a.loader_sites.get(value)
        if site is not None:
            return [site]
        if isinstance(value.func, ast.Attribute) and value.func.attr in MODEL_KEEPING_METHODS:
            value = value.func.value
        else:
            return []
    return []
