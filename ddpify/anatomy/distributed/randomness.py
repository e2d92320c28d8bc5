"""Seeding and random draws: seed calls, draws from torch's global RNG that every rank makes alike,
batches drawn at random offsets that each rank must draw for itself, where a seed call is repeated
with the rank, and `random_split` calls no seed fixes.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.accelerate import prepared_models
from ddpify.anatomy.distributed.names import RANDOM_SPLIT, SEED_CALLS
from ddpify.anatomy.distributed.ranks import mentions_rank
from ddpify.anatomy.distributed.wrappers import wrap_calls
from ddpify.anatomy.full_batch import random_offset_draws, row_losses, trains_without_loader
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite
from ddpify.anatomy.syntax import ancestors, enclosing_function, keyword, method_name
from ddpify.anatomy.vocabulary import RANDOM_DRAWS, RANDOM_FILLS

INITIAL_SEED = "initial_seed"  # torch.initial_seed(): the seed torch's global RNG was last given


@per_anatomy
def seed_calls(a: Anatomy) -> list[CallSite]:
    """`torch.manual_seed(...)`, `seed_everything(...)`, or a call of a local function that seeds."""

    def seeds(n: ast.AST) -> bool:
        return isinstance(n, ast.Call) and a.qualname(n.func) in SEED_CALLS

    return [c for c in a.calls if c.qualname in SEED_CALLS or ((s := a.callee(c.node)) and a.function_contains(s, seeds))]  # type: ignore[arg-type]


@per_anatomy
def draws_alike_on_every_rank(a: Anatomy) -> list[ast.Call]:
    """Draws from torch's global RNG in a training step loop's own code or in a method of this file's
    models (a VAE's or a diffusion model's noise in forward; not a Dataset's) when the script seeds
    that RNG with no rank, outside the step loops: each rank draws the same values there."""
    seeds = seed_calls(a)
    steps = [loop.node for loop in a.step_loops if loop.trains]
    if not seeds or not steps or any(mentions_rank(a, seed.node) or _inside_any(a, seed.node, steps) for seed in seeds):
        return []
    methods = [fn for model in a.model_classes.values() for fn in model.node.body if isinstance(fn, ast.FunctionDef) and fn.name != "__init__"]
    bodies = [step.body for step in steps] + [fn.body for fn in methods]
    return list(dict.fromkeys(n for body in bodies for n in walk_body(body) if _draws_from_global_rng(a, n)))  # type: ignore[attr-defined]


def batches_each_rank_draws(a: Anatomy) -> list[ast.Call]:
    """The draws of batches at random offsets (`get_batch()`: `torch.randint(len(data) - block, (bs,))`)
    where no DataLoader feeds training and the model returns the loss: no loss call of this file
    whose rows the ranks could share, so each rank must draw batches of its own instead."""
    if not trains_without_loader(a) or not row_losses(a).from_model:
        return []
    return random_offset_draws(a)


def seeded_alike(a: Anatomy) -> CallSite | None:
    """The last seed call of torch's global RNG, where none adds the rank (every rank then draws alike)."""
    seeds = seed_calls(a)
    return None if not seeds or any(mentions_rank(a, seed.node) for seed in seeds) else seeds[-1]


def training_start(a: Anatomy, loops: set[ast.AST]) -> ast.stmt | None:
    """The first statement after the last DDP wrap (or `accelerator.prepare` of a model), in the wrap's block,
    that holds one of the training `loops` (or calls what does): what runs before it, model initialisation
    included, keeps the seed."""
    wraps = [site.stmt for site in wrap_calls(a)] + [stmt for stmts in prepared_models(a).values() for stmt in stmts]
    if not loops or not wraps:
        return None
    wrap = max(wraps, key=lambda stmt: stmt.lineno)
    block = a.block_of(a.stands_beside.get(wrap, wrap))  # a wrap not made yet (wraps_made) stands in its anchor's block
    later = [stmt for stmt in block if (stmt.lineno, stmt.col_offset) > (wrap.lineno, wrap.col_offset)]
    return next((stmt for stmt in later if a.body_contains([stmt], lambda n: n in loops)), None)


def repeatable_at(a: Anatomy, seed: CallSite, start: ast.stmt) -> bool:
    """Can the seed call run again before `start`: it has one seed argument, it runs before, and that
    argument reads nothing but constants, globals and names of `start`'s own function?"""
    call: ast.Call = seed.node  # type: ignore[assignment]
    if len(call.args) != 1 or call.keywords or seed.line > start.lineno or isinstance(call.args[0], ast.Starred):
        return False
    names = {n.id for n in ast.walk(call.args[0]) if isinstance(n, ast.Name)}
    scope = enclosing_function(a, call)
    return not names or scope in (MODULE_SCOPE, enclosing_function(a, start))


def loops_around_backward(a: Anatomy) -> set[ast.AST]:
    """The innermost loop around each backward and optimizer step: where the training steps are taken."""
    loops = (next((p for p, _ in ancestors(a, site.node) if isinstance(p, (ast.For, ast.While))), None) for site in a.training_calls)
    return {loop for loop in loops if loop is not None}


def _inside_any(a: Anatomy, node: ast.AST, roots: list[ast.AST]) -> bool:
    return any(parent in roots for parent, _ in ancestors(a, node))


def _draws_from_global_rng(a: Anatomy, node: ast.AST) -> bool:
    """`torch.randn(...)`, `torch.rand_like(x)`, `noise.normal_(0, 1)`, with no `generator=` of their own."""
    if not isinstance(node, ast.Call) or keyword(node, "generator") is not None:
        return False
    module, _, name = (a.qualname(node.func) or "").rpartition(".")
    return (module == "torch" and name in RANDOM_DRAWS) or method_name(node) in RANDOM_FILLS


def unseeded_random_splits(a: Anatomy) -> list[CallSite]:
    """`random_split(...)` calls with no generator and no seed set before them: in a process per GPU,
    each process draws its own split (one rank's validation samples are another's training samples)."""
    return [
        c for c in a.calls_to(RANDOM_SPLIT)
        if len(c.node.args) < 3 and all(kw.arg not in ("generator", None) for kw in c.node.keywords)  # type: ignore[attr-defined]
        and not _seeded_before(a, c.node)
    ]


def _seeded_before(a: Anatomy, node: ast.AST) -> bool:
    """Is a seed set before `node` runs (earlier in its function, or in another function)?"""
    scope = enclosing_function(a, node)
    return any(
        enclosing_function(a, seed.node) != scope or seed.line < node.lineno  # type: ignore[attr-defined]
        for seed in seed_calls(a)
    )
