"""Which random number generators a multi-GPU script seeds, and what each unseeded one costs it.

Three global RNGs matter: torch's (model initialisation, dropout, `torch.randperm`), numpy's and
Python's `random` (augmentation, mixup, index shuffles). A seed call seeds one of them; a library's
seed-everything, a local function that seeds, or an imported function named after seeding
(`utils.fix_random_seeds(args.seed)`, `init_seeds(...)`) seeds each one it reaches (an unseen one:
all of them).

An unseeded RNG costs a process-per-GPU script either its results or its reproducibility:

- wrong results: each rank draws its own numbers where the ranks must agree. FSDP2's `fully_shard`
  (and legacy FSDP without `sync_module_states=True`) keeps each rank's own initialisation of its
  shard, so the model is a mix of several; gradients averaged by hand with no parameter broadcast
  train WORLD_SIZE different models; weights initialised after the DDP wrap are never broadcast;
  a train/validation split drawn on each rank leaks one rank's validation samples into another's
  training set.
- not reproducible: nothing is seeded, or torch is while numpy or `random` drive sampling or
  augmentation unseeded. DDP itself broadcasts rank 0's weights, so the run is right, but no two runs
  are alike. A seed offset by the rank is reproducible (and gives each rank its own augmentation).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator

from ddpify.anatomy import Anatomy
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.every_rank_work import collectives
from ddpify.anatomy.distributed.fsdp import shard_calls, sharded_origins
from ddpify.anatomy.distributed.names import (
    DETERMINISTIC_ALGORITHMS, DETERMINISTIC_FLAG, DIST, DISTRIBUTED_SAMPLER, EVERY_RNG, INDEX_SHUFFLES, NUMPY, NUMPY_NON_DRAWS, NUMPY_RANDOM,
    PYTHON, PYTHON_DRAWS, RESETS, RNG_SEEDERS, SEED_EVERYTHING, SEED_OPTION, SPAWN_CALLS, SYNC_MODULE_STATES, TORCH,
    TRAIN_TEST_SPLIT, WEIGHT_INIT,
)
from ddpify.anatomy.distributed.ranks import mentions_rank, spawn_workers
from ddpify.anatomy.distributed.reaching import MAX_DEPTH, reaching_values, returned_values
from ddpify.anatomy.distributed.samplers import bound_name
from ddpify.anatomy.distributed.wrappers import is_wrapper, model_origins, wrap_calls, wrapped_origins
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite
from ddpify.anatomy.syntax import argument, constant, enclosing_function, keyword, method_name
from ddpify.anatomy.vocabulary import DP_WRAPPER, LEGACY_FSDP, RANDOM_DRAWS, is_model_factory

# ----- seeds -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Seed:
    """A call that seeds `rngs`; `per_rank` when its seed reads the rank."""

    site: CallSite
    rngs: frozenset[str]
    per_rank: bool


@per_anatomy
def seeds(a: Anatomy) -> list[Seed]:
    """Every call that seeds a global RNG, in source order."""
    found = []
    for call in a.calls:
        rngs = _seeded_by(a, call.node)  # type: ignore[arg-type]
        if rngs:
            found.append(Seed(call, rngs, mentions_rank(a, call.node)))
    return found


def _seeded_by(a: Anatomy, call: ast.Call) -> frozenset[str]:
    """The RNGs a call seeds: by name, or through a local function (what its calls seed)."""
    rngs, callee = _seeded_or_called(a, call)
    return rngs if callee is None else _seeded_in_function(a, callee)


def _seeded_or_called(a: Anatomy, call: ast.Call) -> tuple[frozenset[str], str | None]:
    """The RNGs a call seeds by name, or else the local function it calls (which seeds what its calls do)."""
    qualname = a.qualname(call.func) or ""
    if qualname in RNG_SEEDERS:
        return frozenset({RNG_SEEDERS[qualname]}), None
    if qualname in SEED_EVERYTHING:
        return EVERY_RNG, None
    callee = a.callee(call)
    if callee is not None:
        return frozenset(), callee
    return (EVERY_RNG if _names_an_unseen_seeder(a, call, qualname) else frozenset()), None


def _seeded_in_function(a: Anatomy, scope: str) -> frozenset[str]:
    """The RNGs the calls of a local function seed, and those of every local function it reaches
    (found once per function)."""
    found = _seeds_by_function(a)
    if scope not in found:
        reached, todo, rngs = {scope}, [scope], set()
        while todo:
            for call in _calls_by_function(a)[todo.pop()]:
                seeded, callee = _seeded_or_called(a, call)
                rngs |= seeded
                if callee is not None and callee not in reached:
                    reached.add(callee)
                    todo.append(callee)
        found[scope] = frozenset(rngs)
    return found[scope]


@per_anatomy
def _seeds_by_function(a: Anatomy) -> dict[str, frozenset[str]]:
    return {}


@per_anatomy
def _calls_by_function(a: Anatomy) -> dict[str, list[ast.Call]]:
    """The calls in each local function's code (its nested functions' too): each call listed under
    every function above it, from one pass over the calls up their parents."""
    scope_of = {fn.node: scope for scope, fn in a.functions.items()}
    found: dict[str, list[ast.Call]] = {scope: [] for scope in a.functions}
    for site in a.calls:
        node = a.parents.get(site.node)
        while node is not None:
            if node in scope_of:
                found[scope_of[node]].append(site.node)  # type: ignore[arg-type]
            node = a.parents.get(node)
    return found


def _names_an_unseen_seeder(a: Anatomy, call: ast.Call, qualname: str) -> bool:
    """`utils.fix_random_seeds(args.seed)`, `init_seeds(seed)`: a function of another module named
    after seeding (not torch's, numpy's or Python's own, and not a method of a value such as `g.manual_seed`)."""
    root = call.func
    while isinstance(root, ast.Attribute):
        root = root.value
    imported = isinstance(root, ast.Name) and (root.id in a.names.aliases or root is call.func)
    library = qualname.split(".")[0] in EVERY_RNG
    return imported and not library and SEED_OPTION in qualname.rpartition(".")[2].lower()


def seeded_before(a: Anatomy, node: ast.AST, rng: str, per_rank: bool | None = None) -> bool:
    """Is `rng` seeded before `node` runs (earlier in its function, or in another function)? With
    `per_rank` given, only by seeds that do (True) or don't (False) read the rank."""
    scope = enclosing_function(a, node)
    return any(
        rng in seed.rngs and (per_rank is None or seed.per_rank == per_rank)
        and (enclosing_function(a, seed.site.node) != scope or seed.site.line < node.lineno)  # type: ignore[attr-defined]
        for seed in seeds(a)
    )


def seeded_anywhere(a: Anatomy, rng: str) -> bool:
    return any(rng in seed.rngs for seed in seeds(a))


# ----- wrong results -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Unseeded:
    """Where an unseeded RNG costs the script (`node`), what it costs (`message`), and the
    statement a seed must come before (`model`: where the model is built), if any."""

    node: ast.AST
    message: str
    model: ast.stmt | None = None


def wrong_results(a: Anatomy) -> list[Unseeded]:
    """Each place where ranks draw different numbers that must be alike."""
    return [*_unbroadcast_initialisation(a), *_initialised_after_wrap(a), *_split_per_rank(a), *_sharded_data_drawn_per_rank(a)]


def unseeded_sharding(a: Anatomy) -> Unseeded | None:
    """A model sharded (FSDP2, or legacy FSDP without `sync_module_states`) with torch unseeded, or
    seeded with the rank, before it: each rank keeps its own initialisation of its shard."""
    shards = [c for c in shard_calls(a) + a.calls_to(LEGACY_FSDP) if not _broadcasts_weights(c.node)]  # type: ignore[arg-type]
    origins = [origin for c in shards for origin in _model_origins(a, c.node)]  # type: ignore[arg-type]
    if not shards or any(_loads_weights(a, origin) for origin in origins):
        return None
    first = min(shards, key=lambda c: c.line)
    if seeded_before(a, first.node, TORCH, per_rank=False):
        return None
    model = _earliest_statement(a, origins) or first.stmt
    if seeded_before(a, first.node, TORCH, per_rank=True):
        return Unseeded(model, "wrong results: torch is seeded with the rank before this model is built and sharded, so each "
                               "rank initialises its shard from a different seed (fully_shard does not broadcast rank 0's weights)", model)
    return Unseeded(model, "wrong results: torch is never seeded before this model is built and sharded, so each rank "
                           "initialises its shard from its own RNG and the model is a mix of several initialisations "
                           "(fully_shard does not broadcast rank 0's weights)", model)


def _unbroadcast_initialisation(a: Anatomy) -> Iterator[Unseeded]:
    sharded = unseeded_sharding(a)
    if sharded is not None:
        yield sharded
    averaged = _averaged_by_hand(a)
    if averaged is not None:
        yield averaged


def _broadcasts_weights(call: ast.Call) -> bool:
    """Legacy FSDP's `sync_module_states=` given anything but False (a flag the user sets)."""
    option = keyword(call, SYNC_MODULE_STATES)
    return option is not None and not constant(option.value, False)


def _model_origins(a: Anatomy, call: ast.Call) -> set[ast.Call]:
    inner = argument(call, 0, "module")
    return (model_origins(a, inner) or set()) if inner is not None else set()


def _loads_weights(a: Anatomy, origin: ast.Call) -> bool:
    """A pretrained model (`from_pretrained`, `resnet50(weights=...)`): every rank loads the same weights."""
    qualname = a.qualname(origin.func) or ""
    return is_model_factory(qualname) and (qualname.endswith("from_pretrained") or bool(origin.keywords))


def _earliest_statement(a: Anatomy, calls: Iterator[ast.Call] | list[ast.Call]) -> ast.stmt | None:
    stmts = [a.stmt_of[c] for c in calls if c in a.stmt_of]
    return min(stmts, key=lambda s: s.lineno) if stmts else None


def _averaged_by_hand(a: Anatomy) -> Unseeded | None:
    """Gradients all-reduced by hand (`dist.all_reduce(p.grad)`), with no DDP wrap and no broadcast
    of the parameters: unseeded, each rank trains its own model on averaged gradients."""
    reductions = [c for c in collectives(a) if c.qualname.endswith(".all_reduce") and _reads_gradient(c.node)]
    if not reductions or wrap_calls(a) or shard_calls(a) or any(c.qualname.endswith(".broadcast") for c in collectives(a)):
        return None
    models = a.trained_models
    model = models[0].stmt if models else None
    if seeded_before(a, model or reductions[0].node, TORCH, per_rank=False):
        return None
    return Unseeded(model or reductions[0].node, "wrong results: gradients are averaged by hand with no broadcast of the "
                                                 "parameters, and torch is not seeded alike on every rank before this model is "
                                                 "built: each rank trains its own initialisation", model)


def _reads_gradient(call: ast.Call) -> bool:
    return bool(call.args) and any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(call.args[0]))


def _initialised_after_wrap(a: Anatomy) -> Iterator[Unseeded]:
    """`nn.init.normal_(model.module.fc.weight)`, `model.module.fc.reset_parameters()` after the DDP
    wrap, with torch unseeded or seeded by rank: the wrap broadcast rank 0's weights already, so each
    rank keeps its own new ones."""
    for call in a.calls:
        target = _initialised(a, call.node)  # type: ignore[arg-type]
        if target is None or not is_wrapper(a, _root(target)):
            continue
        if not seeded_before(a, call.node, TORCH, per_rank=False):
            yield Unseeded(call.node, "wrong results: weights initialised after the DDP wrap, with torch not seeded alike on "
                                      "every rank: the wrap broadcast rank 0's weights before, so each rank keeps its own")


def _initialised(a: Anatomy, call: ast.Call) -> ast.AST | None:
    """What an initialisation call draws new weights into."""
    if (a.qualname(call.func) or "").startswith(WEIGHT_INIT) and call.args:
        return call.args[0]
    if method_name(call) in RESETS:
        return call.func.value  # type: ignore[attr-defined]
    return None


def _root(expr: ast.AST) -> ast.AST:
    """`model` in `model.module.fc.weight.data`."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return expr


def _split_per_rank(a: Anatomy) -> Iterator[Unseeded]:
    """`train_test_split(...)` with no `random_state`, and index lists shuffled then cut
    (`idx = np.random.permutation(n); train = idx[:k]`), their RNG unseeded before them."""
    for call in a.calls_to(TRAIN_TEST_SPLIT):
        state = keyword(call.node, "random_state")  # type: ignore[arg-type]
        if (state is None or constant(state.value, None)) and not seeded_before(a, call.node, NUMPY):
            yield Unseeded(call.node, "wrong results: train_test_split without random_state, numpy unseeded: each rank draws "
                                      "its own split, so one rank's validation samples are another rank's training samples")
    for call in a.calls:
        rng = INDEX_SHUFFLES.get(call.qualname)
        if rng is None or keyword(call.node, "generator") is not None or seeded_before(a, call.node, rng):  # type: ignore[arg-type]
            continue
        if _cut_later(a, call):
            yield Unseeded(call.node, f"wrong results: indices shuffled with {rng} unseeded, then cut into data sets: each rank "
                                      "draws its own split, so one rank's validation samples are another rank's training samples")


def _sharded_data_drawn_per_rank(a: Anatomy) -> Iterator[Unseeded]:
    """`DistributedSampler(dataset)` over data drawn from an RNG not seeded alike before (`np.random.normal(...)`):
    each rank draws a data set of its own, and the shards partition none."""
    for sampler in a.calls_to(DISTRIBUTED_SAMPLER):
        dataset = argument(sampler.node, 0, "dataset")  # type: ignore[arg-type]
        draws = unseeded_data_draws(a, dataset) if dataset is not None else []
        if draws:
            rng = rng_drawn(a.qualname(draws[0].func) or "")
            yield Unseeded(draws[0], f"wrong results: the data the DistributedSampler shards (line {sampler.line}) is drawn from "
                                     f"{rng} not seeded alike on every rank: each rank draws a data set of its own, so the "
                                     "shards partition none")


def _cut_later(a: Anatomy, call: CallSite) -> bool:
    """Is the shuffled list (the argument of `shuffle`, or the variable the permutation is assigned to)
    sliced later in the same function (`indices[:split]`)?"""
    node: ast.Call = call.node  # type: ignore[assignment]
    holder = node.args[0] if call.qualname.endswith("shuffle") and node.args else bound_name(a, node)
    if not isinstance(holder, ast.Name):
        return False
    fn = a.functions.get(call.scope)
    body = fn.node.body if fn is not None else a.tree.body
    return any(
        isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and isinstance(n.value, ast.Name)
        and n.value.id == holder.id and n.lineno > node.lineno
        for stmt in body for n in ast.walk(stmt)
    )


# ----- not reproducible --------------------------------------------------------------------------
def not_reproducible(a: Anatomy) -> list[Unseeded]:
    """No seed at all (reported where the process group starts), or an RNG left unseeded while torch
    is seeded (reported at its first draw)."""
    if not seeded_anywhere(a, TORCH):
        start = _process_group_start(a)
        if start is None or _started_by_another_file(a, start):
            return []
        return [Unseeded(start.node, "not reproducible: nothing seeds torch's RNG, so no two runs initialise, shuffle or "
                                     "drop out alike", _model_statement(a))]
    return [
        Unseeded(draw, f"not reproducible: {rng} drives sampling or augmentation here but is never seeded (torch is)")
        for rng, draw in unseeded_draws(a)
    ]


def _process_group_start(a: Anatomy) -> CallSite | None:
    """Where the ranks start: `init_process_group`, `mp.spawn`, or the first DDP (or DataParallel) wrap."""
    for calls in (a.calls_to(f"{DIST}.init_process_group"), a.calls_to(*SPAWN_CALLS), wrap_calls(a), a.calls_to(DP_WRAPPER)):
        if calls:
            return calls[0]
    return None


def _started_by_another_file(a: Anatomy, start: CallSite) -> bool:
    """A module with no entry of its own whose function (`setup()`, `Trainer.__init__`) only another
    file calls: that file's entry may seed before it (pytorch/examples' FSDP utils, seeded by T5_training.py)."""
    scope = enclosing_function(a, start.node)
    called_here = any(a.callee(c.node) == scope for c in a.calls)  # type: ignore[arg-type]
    return a.main_guard is None and scope != MODULE_SCOPE and not called_here and scope not in spawn_workers(a)


def _model_statement(a: Anatomy) -> ast.stmt | None:
    """Where the first trained model is built, the place for a seed."""
    origins = wrapped_origins(a) | sharded_origins(a)
    return _earliest_statement(a, list(origins)) or (a.trained_models[0].stmt if a.trained_models else None)


def unseeded_draws(a: Anatomy) -> Iterator[tuple[str, ast.Call]]:
    """The first draw from numpy's and from Python's global RNG, where that RNG is never seeded."""
    for rng, draws in ((NUMPY, numpy_draws(a)), (PYTHON, [c for c in a.calls if c.qualname in PYTHON_DRAWS])):
        if draws and not seeded_anywhere(a, rng):
            yield rng, draws[0].node  # type: ignore[misc]


def numpy_draws(a: Anatomy) -> list[CallSite]:
    return [c for c in a.calls if rng_drawn(c.qualname) == NUMPY]


def rng_drawn(qualname: str) -> str | None:
    """The global RNG a call of `qualname` draws from (`numpy.random.normal`: numpy), if any."""
    module, _, name = qualname.rpartition(".")
    if qualname.startswith(NUMPY_RANDOM) and qualname[len(NUMPY_RANDOM):] not in NUMPY_NON_DRAWS:
        return NUMPY
    if qualname in PYTHON_DRAWS:
        return PYTHON
    return TORCH if module == TORCH and name in RANDOM_DRAWS else None


def unseeded_data_draws(a: Anatomy, dataset: ast.AST) -> list[ast.Call]:
    """The draws from a global RNG, unseeded alike before them, whose numbers `dataset` holds
    (`noise = np.random.normal(...)`; `y = x ** 2 + noise`; `TensorDataset(x, y)`), followed through
    variables and the return values of local functions; not into lambdas or classes (a draw per sample)."""
    found: list[ast.Call] = []
    seen: set[ast.AST] = set()
    todo = [(dataset, 0)]
    while todo:
        expr, depth = todo.pop()
        if expr in seen or depth > MAX_DEPTH:
            continue
        seen.add(expr)
        for node in _walk_outside_lambdas(expr):
            if isinstance(node, ast.Call):
                rng = rng_drawn(a.qualname(node.func) or "")
                if rng is not None and not seeded_before(a, node, rng, per_rank=False):
                    found.append(node)
                callee = a.callee(node)
                todo += [(value, depth + 1) for value in returned_values(a, callee)] if callee else []
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                todo += [(value, depth + 1) for value in reaching_values(a, node)]
    return sorted(dict.fromkeys(found), key=lambda call: (call.lineno, call.col_offset))


def _walk_outside_lambdas(expr: ast.AST) -> Iterator[ast.AST]:
    yield expr
    if not isinstance(expr, ast.Lambda):
        for child in ast.iter_child_nodes(expr):
            yield from _walk_outside_lambdas(child)


def looks_after_reproducibility(a: Anatomy) -> bool:
    """Does the script care that its runs repeat: cudnn's or torch's deterministic switch, a seed of
    any RNG, or a seed option (`--seed`, `args.seed`)?"""
    if any(seeds(a)) or a.calls_to(DETERMINISTIC_ALGORITHMS):
        return True
    called = {n.func for n in a.nodes if isinstance(n, ast.Call)}  # `env.seed(i)` is a method, not an option
    return any(_sets_deterministic(a, n) or (n not in called and _names_seed_option(n)) for n in a.nodes)


def _sets_deterministic(a: Anatomy, node: ast.AST) -> bool:
    return (isinstance(node, ast.Assign) and constant(node.value, True)
            and any(a.qualname(t) == DETERMINISTIC_FLAG for t in node.targets))


def _names_seed_option(node: ast.AST) -> bool:
    """`args.seed`, `cfg.SEED`, or `add_argument("--seed", ...)`."""
    if isinstance(node, ast.Attribute):
        return node.attr.lower() == SEED_OPTION
    return (isinstance(node, ast.Call) and method_name(node) == "add_argument"
            and any(isinstance(x, ast.Constant) and str(x.value).lstrip("-").lower() == SEED_OPTION for x in node.args))

