"""Seeding and random draws: seed calls, draws from torch's global RNG that every rank makes alike, and
`random_split` calls no seed fixes.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.names import RANDOM_SPLIT, SEED_CALLS
from ddpify.anatomy.distributed.ranks import mentions_rank
from ddpify.anatomy.sites import CallSite
from ddpify.anatomy.syntax import ancestors, enclosing_function, keyword, method_name
from ddpify.anatomy.vocabulary import RANDOM_DRAWS, RANDOM_FILLS


@per_anatomy
def seed_calls(a: Anatomy) -> list[CallSite]:
    """`torch.manual_seed(...)`, `seed_everything(...)`, or a call of a local function that seeds."""

    def seeds(n: ast.AST) -> bool:
        return isinstance(n, ast.Call) and a.qualname(n.func) in SEED_CALLS

    return [c for c in a.calls if c.qualname in SEED_CALLS or ((s := a.callee(c.node)) and a.function_contains(s, seeds))]  # type: ignore[arg-type]


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
