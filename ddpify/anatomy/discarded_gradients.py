"""Backward passes whose gradients of a wrapped model are cleared before anything reads them.

A GAN's generator step runs the discriminator's forward on the fakes and back-propagates through
it: `lossG = criterion(netD(fake), ones); lossG.backward()`. Under DistributedDataParallel that
backward all-reduces netD's gradients too, and the next pass begins with `optimizerD.zero_grad()`
(or `netD.zero_grad()`), which clears them before any optimizer step, clip or `.grad` read used
them: one all-reduce a step of gradients thrown away. Run from netD's forward through that
backward under `netD.no_sync()` and the ranks keep those gradients local instead; every number
the script uses stays the same.

The analysis is deliberately narrow; wherever it is unsure it finds nothing:

* the model is one the conversion wraps (a trained model, not a container, not one averaged by
  hand), trained by one optimizer built over all of its parameters (`Adam(netD.parameters())`);
* a forward under no_sync() also tells DDP to skip the broadcast of rank 0's buffers before the
  model's next forward (it broadcasts again before the one after). Rank 0's buffers stay the
  same; the other ranks' BatchNorm statistics may differ until then, which only an eval-mode
  forward reads: the model's buffers are broadcast by no wrap, or are those of torch.nn layers
  (no `register_buffer` in the file) and the model is never put in eval mode;
* the backward is a statement of a step loop's own body (no `else:`), and so is the model's first
  forward after the last statement before it that back-propagates or uses the model's gradients:
  the statements from that forward through the backward are one straight run of the body;
* every path from the backward reaches a statement of the body that clears the model's gradients
  (its optimizer's `zero_grad()` or its own) before any use of them: an optimizer step that may
  hold its parameters (a GradScaler's too), `unscale_`, a gradient clip, a `.grad` read, another
  backward (which would add to them), or a call into a function of this file doing any of those.
  Leaving the loop counts as a path: no such use may stand anywhere outside the loop;
* the loop body names the model only to call it (`netD(x)`) or clear it; no function of this file
  it calls names it;
* no graph crosses the run's edges: what the run reads is not computed from an earlier forward of
  the model (it would be back-propagated unsynced), and no backward of the loop reads what the
  run computed (it would reach a forward that ran unsynced). Names are followed through
  assignments and through the receivers of method calls (`history.append(lossG)`); a value kept
  anywhere else (`self.x = ...`, `d[k] = ...`) ends the analysis;
* the script skips no sync itself, switches no `requires_grad`, keeps no graph (`retain_graph`,
  `create_graph`, `torch.autograd.grad`: WGAN-GP's gradient penalty), so there is nothing to skip
  or no way to be sure.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable

from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.ddp_options import BUFFER_REGISTRATION, BUILTIN_LAYERS, buffers_need_no_broadcast
from ddpify.anatomy.distributed.wrappers import uses_no_sync
from ddpify.anatomy.owned_optimizers import owned_optimizers
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import LoopSite, ModelSite, Ref
from ddpify.anatomy.syntax import argument, method_name
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.values import ROLE_OPTIMIZER, ROLE_SCALER, ROLE_SCHEDULER
from ddpify.anatomy.vocabulary import MODEL_CONTAINERS

_BACKWARD = "backward"
_STEP = "step"
_CLEAR = "zero_grad"  # an optimizer's or a module's: clears the gradients it holds
_PARAMETERS = "parameters"
_GRADIENT = "grad"  # `p.grad`
_GRADIENT_READERS = frozenset({"unscale_"})  # a GradScaler's unscale_(optimizer) rewrites its gradients
_CLIPS = "clip_grad"  # torch.nn.utils.clip_grad_norm_ / clip_grad_value_
_AUTOGRAD = frozenset({"torch.autograd.grad", "torch.autograd.backward"})
_KEPT_GRAPH = frozenset({"retain_graph", "create_graph"})
_REQUIRES_GRAD = "requires_grad"
_EVAL_MODE = "eval"
_MODE = "train"  # `model.train(False)` is eval mode too


@dataclass(frozen=True)
class DiscardedSync:
    """A run of a step loop's body whose backward all-reduces gradients of `model` that are cleared unused."""

    model: ModelSite
    loop: LoopSite
    statements: tuple[ast.stmt, ...]  # from the model's forward through the backward: one straight run of the body
    cleared_by: ast.stmt  # the statement that clears them before any use


@per_anatomy
def discarded_syncs(a: Anatomy) -> list[DiscardedSync]:
    """Each run whose backward all-reduces a wrapped model's gradients that are cleared before any use;
    runs that would overlap (two models in the same statements) are left out. A script that trains one model
    is not searched (cheap to tell, and the common case): its one backward a step feeds its own optimizer."""
    if len(a.trained_models) < 2 or _script_bars(a):
        return []
    averaged = {optimizer.model for optimizer in owned_optimizers(a)}
    models = [m for m in a.trained_models if m not in averaged and not m.container and m.class_name not in MODEL_CONTAINERS
              and _buffers_unread_when_not_broadcast(a, m)]
    found = []
    for loop in a.step_loops:
        if loop.trains and isinstance(loop.node, (ast.For, ast.AsyncFor)) and not loop.node.orelse:
            runs = [run for model in models for run in _LoopOfModel(a, loop, model).runs()]
            shared = {id(s) for i, run in enumerate(runs) for other in runs[i + 1:] for s in run.statements
                      if any(s is t for t in other.statements)}
            found += [run for run in runs if not any(id(s) in shared for s in run.statements)]
    return found


def _script_bars(a: Anatomy) -> bool:
    """Does the script skip syncs itself, switch `requires_grad`, or keep a graph for a second backward?"""
    if uses_no_sync(a):
        return True
    for node in a.nodes:
        if isinstance(node, ast.keyword) and node.arg in _KEPT_GRAPH:
            return True
        if isinstance(node, ast.Call) and (a.qualname(node.func) in _AUTOGRAD or method_name(node) == _REQUIRES_GRAD + "_"):
            return True
        if isinstance(node, ast.Attribute) and node.attr == _REQUIRES_GRAD and isinstance(node.ctx, ast.Store):
            return True
    return False


def _buffers_unread_when_not_broadcast(a: Anatomy, model: ModelSite) -> bool:
    """May the forward after one under no_sync() skip the broadcast of rank 0's buffers? Yes where the wrap
    broadcasts none, or where the only buffers training changes are BatchNorm's running statistics (a model
    of this file's classes or torch.nn layers, in a file that registers no buffer of its own) and no forward
    reads them: the model is never put in eval mode."""
    if buffers_need_no_broadcast(a, model):
        return True
    known = model.class_name in a.model_classes or model.class_name.startswith(BUILTIN_LAYERS)
    if not known or any(method_name(n) == BUFFER_REGISTRATION for n in a.nodes):
        return False
    return model.has_batchnorm is False or not any(
        (method_name(n) == _EVAL_MODE or method_name(n) == _MODE and (n.args or n.keywords))  # type: ignore[attr-defined]
        and a.ref(n.func.value) == model.target for n in a.nodes)  # type: ignore[attr-defined]


class _LoopOfModel:
    """One wrapped model in one step loop: the runs of its body whose backward's gradients of it are discarded."""

    def __init__(self, a: Anatomy, loop: LoopSite, model: ModelSite) -> None:
        self.a, self.loop, self.model = a, loop, model
        self.body: list[ast.stmt] = loop.node.body  # type: ignore[attr-defined]
        over = [site.node for site in a.optimizers if any(self._is_model(n) for n in a.walk_through_variables(site.node))]
        others = [site.node for site in a.optimizers if site.node not in over]
        self.optimizers = {ref for call in over if (ref := self._bound_ref(call)) is not None}  # type: ignore[arg-type]
        self.clearing = {ref for call in over if (ref := self._bound_ref(call)) is not None and self._over_all_parameters(call)}  # type: ignore[arg-type]
        self.others = {ref for call in others if (ref := self._bound_ref(call)) is not None}  # type: ignore[arg-type]
        self.one_optimizer = len(over) == 1 and len(self.optimizers) == 1

    def runs(self) -> list[DiscardedSync]:
        if not self.one_optimizer or not self._named_only_to_call() or self._used_outside_the_loop():
            return []
        found = []
        for index, stmt in enumerate(self.body):
            if isinstance(stmt, ast.Expr) and method_name(stmt.value) == _BACKWARD:
                run = self._run(index)
                if run is not None:
                    found.append(run)
        return found

    def _run(self, backward: int) -> DiscardedSync | None:
        """The run ending with the backward at body[backward], if its gradients of the model are discarded."""
        uses = [i for i in range(backward) if self._uses_gradients([self.body[i]])]
        first = next((i for i in range(uses[-1] + 1 if uses else 0, backward + 1) if self._calls_model(self.body[i])), None)
        if first is None:
            return None
        around = self.body[backward + 1:] + self.body[:first]  # to the next pass's run, the way the loop goes round
        cleared_by = next((s for s in around if self._clears(s) or self._uses_gradients([s])), None)
        if cleared_by is None or not self._clears(cleared_by):
            return None
        run = self.body[first:backward + 1]
        if not self._graphs_stay_apart(around, run):
            return None
        return DiscardedSync(self.model, self.loop, tuple(run), cleared_by)

    # ----- the model, its optimizer and its gradients ------------------------------------------
    def _is_model(self, node: ast.AST) -> bool:
        return isinstance(node, (ast.Name, ast.Attribute)) and self.a.ref(node) == self.model.target

    def _bound_ref(self, call: ast.Call) -> Ref | None:
        """The variable an optimizer is bound to (`optimizerD = Adam(...)`), as a Ref."""
        stmt = self.a.stmt_of[call]
        if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1:
            return self.a.ref(stmt.targets[0])
        return None

    def _over_all_parameters(self, call: ast.Call) -> bool:
        """Is the optimizer built over `model.parameters()` itself (its zero_grad clears every gradient of the model)?"""
        params = argument(call, 0, "params")
        return isinstance(params, ast.Call) and method_name(params) == _PARAMETERS and self._is_model(params.func.value)  # type: ignore[attr-defined]

    def _clears(self, stmt: ast.stmt) -> bool:
        """`optimizerD.zero_grad()` (its optimizer, built over all its parameters) or `netD.zero_grad()`, as a statement."""
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if method_name(call) != _CLEAR:
            return False
        receiver = call.func.value  # type: ignore[union-attr]
        return self._is_model(receiver) or self.a.ref(receiver) in self.clearing

    def _uses_gradients(self, stmts: list[ast.stmt]) -> bool:
        """Do the statements (or functions of this file they call) read or add to the model's gradients?"""
        return self.a.body_contains(stmts, self._reads_gradients)

    def _reads_gradients(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == _GRADIENT:
            return True
        if not isinstance(node, ast.Call):
            return False
        name, qualname = method_name(node), self.a.qualname(node.func) or ""
        if name == _BACKWARD or name in _GRADIENT_READERS or _CLIPS in qualname or qualname in _AUTOGRAD:
            return True
        return name == _STEP and self._may_step_model(node)

    def _may_step_model(self, step: ast.Call) -> bool:
        """Might `x.step(...)` update the model: any step but a scheduler's, or one of an optimizer over other models only?"""
        receiver = step.func.value  # type: ignore[attr-defined]
        if self.a.has_role(receiver, ROLE_SCHEDULER) and not self.a.has_role(receiver, ROLE_OPTIMIZER):
            return False
        stepped = step.args[0] if self.a.has_role(receiver, ROLE_SCALER) and step.args else receiver
        return self.a.ref(stepped) not in self.others or self.a.ref(stepped) in self.optimizers

    def _used_outside_the_loop(self) -> bool:
        """Does anything outside the loop (where leaving it goes) read or add to the model's gradients?"""
        inside = {id(n) for n in ast.walk(self.loop.node)}
        return any(id(n) not in inside and self._reads_gradients(n) for n in self.a.nodes)

    def _calls_model(self, stmt: ast.stmt) -> bool:
        return any(isinstance(n, ast.Call) and self._is_model(n.func) for n in walk_body([stmt]))

    def _named_only_to_call(self) -> bool:
        """Does the loop body name the model only as `model(...)` and `model.zero_grad()`, and no function of
        this file it calls name it at all?"""
        allowed = set()
        for node in walk_body(self.body):
            if isinstance(node, ast.Call) and self._is_model(node.func):
                allowed.add(id(node.func))
            elif isinstance(node, ast.Call) and method_name(node) == _CLEAR and self._is_model(node.func.value):  # type: ignore[attr-defined]
                allowed.add(id(node.func.value))  # type: ignore[attr-defined]
        return not self.a.body_contains(self.body, lambda n: self._is_model(n) and id(n) not in allowed)

    # ----- graphs across the run's edges -------------------------------------------------------
    def _graphs_stay_apart(self, around: list[ast.stmt], run: list[ast.stmt]) -> bool:
        """Does the run read nothing computed from an earlier forward of the model, and no backward of the loop
        read what the run computed? (`around`: the rest of the body, from the backward round to the run.)"""
        if any(not _names_only(stmt) for stmt in run):
            return False
        earlier = _Flow(self.a, source=lambda n: isinstance(n, ast.Call) and self._is_model(n.func))
        for stmt in around:
            if not earlier.follow(stmt):
                return False
        for stmt in run:
            if earlier.reads(stmt):
                return False
            earlier.follow(stmt, sources=False)
        later = _Flow(self.a, {name for stmt in run for name in _stored(stmt)})
        for stmt in around:
            if later.reads(stmt) and any(method_name(n) == _BACKWARD for n in walk_body([stmt])):
                return False
            if not later.follow(stmt):
                return False
        return True


class _Flow:
    """The names that may hold a graph through a forward, followed statement by statement: those given,
    and what the statements compute from them or from a `source` (a forward of the model)."""

    def __init__(self, a: Anatomy, tainted: set[str] | None = None, source: Callable[[ast.AST], bool] = lambda n: False) -> None:
        self.a, self.source = a, source
        self.tainted = set(tainted or ())

    def reads(self, stmt: ast.stmt) -> bool:
        """Does the statement read a name that may hold such a graph?"""
        return self._reads(stmt, sources=False)

    def follow(self, stmt: ast.stmt, sources: bool = True) -> bool:
        """The names past `stmt` (`sources`: counting its own forwards); False when a graph may be kept where
        names do not follow it (`self.x = ...`, `d[k] = ...`)."""
        if self._reads(stmt, sources):
            if not _names_only(stmt):
                return False
            self.tainted |= _stored(stmt) | self._receivers(stmt, sources)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            self.tainted -= _stored(stmt)  # rebound to what holds no such graph
        return True

    def _receivers(self, stmt: ast.stmt, sources: bool) -> set[str]:
        """`history` in `history.append(lossG)`: variables (not modules) a method call may fill with a graph it is passed."""
        filled = set()
        for n in walk_body([stmt]):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name):
                passed = [*n.args, *(kw.value for kw in n.keywords)]
                if n.func.value.id not in self.a.names.aliases and any(self._reads(p, sources) for p in passed):
                    filled.add(n.func.value.id)
        return filled

    def _reads(self, node: ast.AST, sources: bool) -> bool:
        return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in self.tainted or sources and self.source(n)
                   for n in ast.walk(node))


def _stored(stmt: ast.stmt) -> set[str]:
    return {n.id for n in walk_body([stmt]) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _names_only(stmt: ast.stmt) -> bool:
    """Does the statement store only into plain names (no `self.x = ...`, `d[k] = ...`, no `global`)?"""
    return not any(isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del))
                   or isinstance(n, (ast.Global, ast.Nonlocal)) for n in walk_body([stmt]))
