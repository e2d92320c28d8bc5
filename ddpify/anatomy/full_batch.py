"""Training data that no DataLoader feeds: whole tensors, a graph's masks, batches cut by hand.

A script that trains on `x = torch.linspace(...)`, on a graph's nodes picked by a train mask, or on
`x[i:i + bs]` slices has no loader for a DistributedSampler. Its data is the same on every rank
(built alike, or seeded alike), so the ranks can share the rows of each loss instead: a loss that
is a mean over the rows of its arguments, computed on every WORLD_SIZE-th row and weighted by its
share of the rows (a sum by WORLD_SIZE), gives under DDP's gradient average exactly the single-process
gradient.

`row_losses` finds the loss calls of every backward and says, for each one the ranks can't share
that way, why not. `forward_on_rows` finds, for a loss call, the forward whose output rows it takes
(`criterion(model(x), y)`): where that forward works row by row (anatomy/row_wise.py), each rank can
run it on its rows of `x` only, and the ranks split the forward's and backward's work too. `random_offset_draws` finds batches picked at random offsets (`get_batch()` in
char-level and GPT scripts): drawn alike on every rank, their rows are shared like any batch's, but
where the model returns the loss, each rank must draw its own instead.

`whole_data_forward` finds, for nn.DataParallel, a forward that runs on the whole data at every step, of whose
output the loss takes some rows (`criterion(out[train_mask], ...)`: the others are there to be read, a graph's
nodes), and that mixes its rows (`adj @ self.first(features)`): DataParallel splits every input along dim 0 over
its GPUs, which hands each GPU some rows of the adjacency and some of the features, not a part of a batch of samples.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator

from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.environments import trains_on_environment
from ddpify.anatomy.forward_losses import model_calls, reads_after
from ddpify.anatomy.losses import full_reduction, loss_terms, sums_over_batch
from ddpify.anatomy.model_losses import ModelRowLoss, model_row_loss
from ddpify.anatomy.row_wise import forward_mixes_rows, keeps_all_rows
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import ModelSite
from ddpify.anatomy.syntax import ancestors, enclosing_function, keyword
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.values import ROLE_CRITERION, ROLE_MODEL, ROLE_SCALER
from ddpify.anatomy.distributed.reaching import reaching_values
from ddpify.anatomy.vocabulary import INDEX_DRAWS, RANDOM_DRAWS
from ddpify.anatomy.distributed.names import NUMPY, PYTHON, PYTHON_DRAWS, TORCH
from ddpify.anatomy.distributed.seeding import numpy_draws, seeded_anywhere
from ddpify.anatomy.sites import CallSite

# options that make a loss other than a plain mean or sum over its rows (a class-weighted or token mean, no reduction)
_NOT_A_ROW_MEAN = ("weight", "ignore_index", "reduce")


@dataclass(frozen=True)
class RowLosses:
    """The loss calls whose rows the ranks can share, (line, why) for each loss they can't, (line, why) for
    the backwards whose loss comes from no loss call or reduction of this file (the model returns it), and
    the model calls whose returned loss the ranks can share by rows instead."""

    calls: tuple[ast.Call, ...]
    refusals: tuple[tuple[int, str], ...]
    from_model: tuple[tuple[int, str], ...]
    model_calls: tuple[ModelRowLoss, ...] = ()


@dataclass(frozen=True)
class RowForward:
    """`model(x)`, a forward that works row by row, whose output rows a loss call takes whole (inline, or through
    a name the loss alone reads): each rank can run it on its rows of `x` only."""

    call: ast.Call
    rows: ast.expr


def trains_without_loader(a: Anatomy) -> bool:
    """Does the script train on data no DataLoader (here or in another file) feeds?"""
    return (a.trains and not a.train_loaders and not a.foreign_loaders and not a.facts.data_loaded_elsewhere
            and not trains_on_environment(a))  # an environment's episodes: ddp/environments.py


def row_losses(a: Anatomy) -> RowLosses:
    """The loss calls of every `loss.backward()` (or `scaler.scale(loss).backward()`) of the script."""
    calls: list[ast.Call] = []
    refusals: list[tuple[int, str]] = []
    from_model: list[tuple[int, str]] = []
    model_calls: list[ModelRowLoss] = []
    draws = random_offset_draws(a)  # each rank draws its own batches there (ddp/batch_draws.py): no rows to share
    for site, loss in _backward_losses(a):
        terms = loss_terms(a, loss, by_hand=True)
        shared = model_row_loss(a, loss) if not terms and not draws else None
        if isinstance(shared, ModelRowLoss):
            model_calls.append(shared)
        elif not terms:
            from_model.append((site.line, _why_no_loss_call(a, loss, shared)))
        for term in terms:
            why = _why_not_row_mean(a, term)
            if why:
                refusals.append((term.lineno, why))
            elif term not in calls:
                calls.append(term)
    return RowLosses(tuple(calls), tuple(refusals), tuple(from_model), tuple(dict.fromkeys(model_calls)))


def _backward_losses(a: Anatomy) -> Iterator[tuple[CallSite, ast.expr]]:
    """Each `loss.backward()` of the script, with its loss."""
    for site in a.training_calls:
        call: ast.Call = site.node  # type: ignore[assignment]
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
            yield site, backward_loss(a, call.func.value)


def forward_on_rows(a: Anatomy, loss: ast.Call) -> RowForward | str:
    """The forward whose output `loss` (a loss call of `row_losses`) takes as its first argument, where each rank can
    run it on its rows; else why every rank runs it on the whole batch."""
    if full_reduction(a, loss) is not None or len(loss.args) < 2:
        return f"`{ast.unparse(loss)}` takes no model output and targets"
    output = loss.args[0]
    picked = isinstance(output, ast.Subscript)  # `out[train_mask]`: rows picked from the whole forward's output
    forward = _forward_of(a, output.value if picked else output)  # type: ignore[attr-defined]
    if forward is None:
        return f"the loss takes `{ast.unparse(output)}`, which no model call returns alone"
    why = forward_mixes_rows(a, forward)
    if why or picked:
        return f"the forward may mix rows: {why}" if why else f"the loss takes `{ast.unparse(output)}`, rows picked from the forward's output"
    if len(forward.args) != 1 or forward.keywords or isinstance(forward.args[0], ast.Starred):
        return f"`{ast.unparse(forward)}` takes more than one batch of rows"
    if any(isinstance(n, ast.Call) for n in ast.walk(forward.args[0])):
        return f"`{ast.unparse(forward)}` computes its input in the call (its rows are counted again after the forward)"
    if forward is not output and not _read_alone(a, output):
        return f"`{ast.unparse(output)}` is read besides the loss, where it would hold this rank's rows only"
    return RowForward(forward, forward.args[0])


def _forward_of(a: Anatomy, output: ast.expr) -> ast.Call | None:
    """`model(x)`, inline or bound to the name `out` that the loss reads."""
    values = reaching_values(a, output) if isinstance(output, ast.Name) else [output]
    forward = values[0] if len(values) == 1 else None
    return forward if isinstance(forward, ast.Call) and a.has_role(forward.func, ROLE_MODEL) else None


def _read_alone(a: Anatomy, output: ast.Name) -> bool:
    """Is the loss's read of `out` the only one of the value `out = model(x)` binds?"""
    stmt = a.stmt_of.get(reaching_values(a, output)[0])
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return False
    return reads_after(a, stmt, stmt.targets[0]) == [output]


def whole_data_forward(a: Anatomy, model: ModelSite) -> tuple[ast.Call, str] | None:
    """A call of `model` that runs its forward on the whole data (no loader, no batch built in a loop), of whose
    output a loss takes some rows only, where that forward mixes rows, and why (BatchNorm and Dropout aside: they
    keep samples apart, row_wise.py). Rows run through the forward that the loss never reads are there for the
    others to read: a graph's nodes, not samples (a forward that merely may mix rows, unseen layers or a reshape,
    is no sign of that)."""
    if not trains_without_loader(a):
        return None
    calls = [call for call, _ in model_calls(a) if any(
        isinstance(o, ModelSite) and o.target == model.target for o in a.origins(call.func, ROLE_MODEL))]
    if any(_takes_whole_data(a, call) is False for call in calls):
        return None
    for _, loss in _backward_losses(a):
        for term in loss_terms(a, loss, by_hand=True):
            output = term.args[0] if term.args else None
            if not isinstance(output, ast.Subscript) or keeps_all_rows(output.slice):
                continue
            forward = _forward_of(a, output.value)
            why = forward_mixes_rows(a, forward, samples=True) if forward in calls and _takes_whole_data(a, forward) else None
            if why:
                return forward, why  # type: ignore[return-value]
    return None


def _takes_whole_data(a: Anatomy, call: ast.Call) -> bool | None:
    """Does `call` take the same data at every step (True), a batch built in a loop around it (False)? None: a
    parameter of its function, which its callers fill."""
    read = {n.id for arg in [*call.args, *(k.value for k in call.keywords)] for n in ast.walk(arg) if isinstance(n, ast.Name)}
    loops = [p for p, _ in ancestors(a, call) if isinstance(p, (ast.For, ast.While))
             and enclosing_function(a, p) == enclosing_function(a, call)]
    if read & {n.id for n in walk_body(loops) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}:
        return False
    function = a.functions.get(enclosing_function(a, call))
    return None if function is not None and read & set(function.params) else True


def unseeded_rngs(a: Anatomy) -> list[str]:
    """The global RNGs to seed alike on every rank before the ranks share the rows of each batch: those the
    script draws from and seeds nowhere (torch's, numpy's, Python's: unseeded, each rank draws its own data
    or its own forward: torch seeds each process apart), and then torch too, since its seed makes the whole-batch forward (dropout, init)
    the same on every rank and a script seeded in part is not reproducible (DDP024)."""
    drawn = {TORCH: any(_draws_from(call, TORCH) for call in a.calls), NUMPY: bool(numpy_draws(a)),
             PYTHON: any(call.qualname in PYTHON_DRAWS for call in a.calls)}
    unseeded = [rng for rng, draws in drawn.items() if draws and not seeded_anywhere(a, rng)]
    if unseeded and TORCH not in unseeded and not seeded_anywhere(a, TORCH):
        unseeded.insert(0, TORCH)
    return unseeded


def _draws_from(call: CallSite, rng: str) -> bool:
    module, _, name = call.qualname.rpartition(".")
    return module == rng and name in RANDOM_DRAWS


def random_offset_draws(a: Anatomy) -> list[ast.Call]:
    """`torch.randint(...)` (randperm, multinomial) in the loop around a backward or in a function of this
    file that the loop calls: each step's batch picked at random offsets (`get_batch()`)."""
    steps = [loop.body for loop in dict.fromkeys(_loop_around(a, site.node) for site in a.training_calls) if loop]
    called = [a.callee(n) for body in steps for n in walk_body(body) if isinstance(n, ast.Call)]
    bodies = steps + [a.functions[name].node.body for name in dict.fromkeys(called) if name]
    return list(dict.fromkeys(n for body in bodies for n in walk_body(body) if _draws_indices(a, n)))


def _loop_around(a: Anatomy, node: ast.AST) -> ast.For | ast.While | None:
    return next((parent for parent, _ in ancestors(a, node) if isinstance(parent, (ast.For, ast.While))), None)


def _draws_indices(a: Anatomy, node: ast.AST) -> bool:
    module, _, name = (a.qualname(node.func) or "").rpartition(".") if isinstance(node, ast.Call) else ("", "", "")
    return module == "torch" and name in INDEX_DRAWS


def backward_loss(a: Anatomy, receiver: ast.expr) -> ast.expr:
    """`loss` in `loss.backward()` and in `scaler.scale(loss).backward()`."""
    if (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) and receiver.func.attr == "scale"
            and receiver.args and a.has_role(receiver.func.value, ROLE_SCALER)):
        return receiver.args[0]
    return receiver


def _why_no_loss_call(a: Anatomy, loss: ast.expr, why_not_model_rows: str | None) -> str:
    """Why no loss call of this file reaches `loss`: the model returns it (and why its rows can't be shared),
    or it is written by hand otherwise."""
    ref = a.ref(loss)
    bound = [b.stmt for b in bindings(a).get(ref, ()) if b.stmt.lineno <= loss.lineno] if ref is not None else []
    value = bound[-1].value if bound and isinstance(bound[-1], ast.Assign) else loss
    if isinstance(value, ast.Call) and a.has_role(value.func, ROLE_MODEL):
        return (f"the model returns the loss (`{ast.unparse(bound[-1]) if bound else ast.unparse(loss)}`), computed in its forward "
                f"from the whole batch: {why_not_model_rows or 'only a loss this file computes can be shared by rows'}")
    return "the loss is written by hand, and is no mean or sum over all the elements of one tensor"


def _why_not_row_mean(a: Anatomy, call: ast.Call) -> str | None:
    """Why this loss call is no mean over the rows of its arguments the ranks can share (None: it is).
    A mean or sum of all the elements of one tensor is shared by its rows, whatever the tensor."""
    if full_reduction(a, call) is not None:
        return None
    name = ast.unparse(call.func)
    if not call.args or any(isinstance(arg, ast.Starred) for arg in call.args):
        return f"{name}(...) takes no batch of rows as positional arguments"
    if sums_over_batch(a, call) is None:
        return f"{name}(...) takes its reduction at run time"
    other = next((k for c in _loss_and_criterion(a, call) for k in _NOT_A_ROW_MEAN if keyword(c, k) is not None), None)
    if other:
        return f"{name}(...) with {other}= is no plain mean or sum over the rows"
    reduction = [keyword(c, "reduction") for c in _loss_and_criterion(a, call)]
    if any(k is not None and not (isinstance(k.value, ast.Constant) and k.value.value in ("mean", "sum")) for k in reduction):
        return f"{name}(...) neither averages nor sums over the rows (its reduction is neither 'mean' nor 'sum')"
    return None


def _loss_and_criterion(a: Anatomy, call: ast.Call) -> list[ast.Call]:
    """The loss call and the construction of its criterion (`criterion = nn.CrossEntropyLoss(...)`)."""
    if isinstance(call.func, ast.Call):
        return [call, call.func]
    if isinstance(call.func, (ast.Name, ast.Attribute)) and a.has_role(call.func, ROLE_CRITERION):
        return [call, *(v for v in reaching_values(a, call.func) if isinstance(v, ast.Call))]
    return [call]
