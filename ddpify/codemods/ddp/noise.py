"""Each rank draws its own noise once the model is wrapped.

A script that seeds torch's global RNG once runs that seed on every rank, so a draw in the training
step (`noise = torch.randn(batch, nz)`, diffusion timesteps, augmentation) gives every rank the same
values: the global batch holds WORLD_SIZE copies of the same noise. Just before training starts (the
first statement after the last DDP wrap, in its block, that trains or calls what trains; the wrap has
broadcast rank 0's weights, and model initialisation after it still runs alike on every rank), the
script's own seed call is made again with the rank added (`torch.manual_seed(seed + RANK)`). Where
that call can't be repeated there (its seed is a variable of another function, it takes no
argument, training is not reached from the wrap's block), the transform advises.

numpy's or Python's global RNG that the script draws from but never seeds, next to a seeded torch
(pair sampling in a Dataset with `random.randint`, mixup's `np.random.beta`), gave each process its
own values: right after torch's seed call it is seeded with that seed plus the rank
(`random.seed(args.seed + RANK)`), so each rank still draws its own values and runs repeat (ddpify
lint's DDP024 finds nothing left unseeded). Where a method of the script's models draws from it (a
depth chosen by `random.randint` in forward), every rank gets the same seed: the ranks must agree.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy, CallSite
from ddpify.anatomy.distributed.names import NUMPY, PYTHON_DRAWS, TORCH
from ddpify.anatomy.distributed.randomness import INITIAL_SEED, draws_alike_on_every_rank, repeatable_at, seed_calls, training_start
from ddpify.anatomy.distributed.seeding import Seed, numpy_draws, seeds, unseeded_draws
from ddpify.anatomy.syntax import enclosing_function
from ddpify.codemods.base import PlannedOnTheWrapsMade, Transform
from ddpify.codemods.ddp.runtime import RANK
from ddpify.codemods.options import Options

_WHY = ("# ddpify: each rank draws its own noise from here on (the DDP wrap has\n"
        "# broadcast rank 0's weights, so the models stay identical).\n")


class NoiseOfEachRank(PlannedOnTheWrapsMade):
    """Seed each rank apart once the models are wrapped, where every rank would draw the same noise."""

    NAME = "noise"

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        # seeds and draws are the user's; no transform adds one
        return bool(draws_alike_on_every_rank(anatomy)) or bool(_unseeded_beside_torch(anatomy))

    def plan(self) -> None:
        self._seed_the_unseeded_rngs()
        reseed = noise_reseed(self.anatomy)
        if reseed is not None:
            seed, start = reseed
            self.insert_before(start, f"{_WHY}{reseeded(seed)}\n")
            self.changed(start.lineno, f"{reseeded(seed)} before training: each rank draws its own noise, "
                                      "where every rank drew the same values")
            return
        for draw in draws_alike_on_every_rank(self.anatomy):
            self.advise(draw.lineno, "every rank draws the same values here (the global RNG is seeded alike on every rank): "
                                     "to give each rank its own, seed with the rank once the model is wrapped, e.g. "
                                     f"`torch.manual_seed(seed + {RANK})` just before the training loop (DDP has already "
                                     "broadcast rank 0's weights, so the models stay identical)")

    def _seed_the_unseeded_rngs(self) -> None:
        """After torch's seed call: numpy's and Python's RNG, drawn from but never seeded, seeded with
        the same seed (plus the rank, unless a model draws from it)."""
        unseeded = _unseeded_beside_torch(self.anatomy)
        if not unseeded:
            return
        seed: Seed = _torch_seed(self.anatomy)  # type: ignore[assignment]
        stmt = self.anatomy.parents.get(seed.site.node)
        argument = ast.unparse(seed.site.node.args[0])  # type: ignore[attr-defined]
        lines = [f"{_seeder(self, draw)}({argument}{_rank_offset(self.anatomy, rng)})" for rng, draw in unseeded]
        self.insert_after(stmt, "\n".join(lines) + "\n")  # type: ignore[arg-type]
        self.changed(seed.site.line, f"{'; '.join(lines)}: drawn from but never seeded; seeded apart on each rank where it "
                                     "draws data (each rank its own), alike where a model draws its structure (every rank the same)")


def noise_reseed(a: Anatomy) -> tuple[CallSite, ast.stmt] | None:
    """Where the noise drawn alike on every rank is made each rank's own: (the seed call, the statement
    it is repeated before with the rank), or None (no such draws, or no place to repeat it)."""
    if not draws_alike_on_every_rank(a):
        return None
    seed = seed_calls(a)[-1]
    start = training_start(a, {loop.node for loop in a.step_loops if loop.trains})
    return (seed, start) if start is not None and repeatable_at(a, seed, start) else None


def rank_seed() -> str:
    """A seed of this rank's own: torch's current seed (as the script set it, or torch drew it) plus the
    rank, within the 64 bits a seed may take."""
    return f"({TORCH}.{INITIAL_SEED}() + {RANK}) % 2**64"


def reseeded(seed: CallSite) -> str:
    """The seed call again, with the rank added to its seed."""
    call: ast.Call = seed.node  # type: ignore[assignment]
    return f"{ast.unparse(call.func)}({ast.unparse(call.args[0])} + {RANK})"


def _unseeded_beside_torch(a: Anatomy) -> list[tuple[str, ast.Call]]:
    """(the RNG, its first draw) for numpy's and Python's RNG drawn from but never seeded,
    where one statement of its own seeds torch with one argument and no rank."""
    torch_seed = _torch_seed(a)
    if torch_seed is None:
        return []
    call: ast.Call = torch_seed.site.node  # type: ignore[assignment]
    if len(call.args) != 1 or call.keywords or isinstance(call.args[0], ast.Starred) or not isinstance(a.parents.get(call), ast.Expr):
        return []
    return list(unseeded_draws(a))


def _torch_seed(a: Anatomy) -> Seed | None:
    """The first call that seeds torch alone, with no rank."""
    return next((s for s in seeds(a) if s.rngs == {TORCH} and not s.per_rank), None)


def _rank_offset(a: Anatomy, rng: str) -> str:
    """` + RANK`, unless a method of this file's models draws from `rng` (`random.randint(0, 3)` layers
    in forward): there every rank must draw alike, or the ranks' graphs and gradients differ."""
    draws = numpy_draws(a) if rng == NUMPY else a.calls_to(*PYTHON_DRAWS)
    in_models = any(enclosing_function(a, d.node).split(".")[0] in a.model_classes for d in draws)
    return "" if in_models else f" + {RANK}"


def _seeder(transform: Transform, draw: ast.Call) -> str:
    """How the script spells the seed function of the RNG `draw` reads: `np.random.seed` beside
    `np.random.rand(...)`, `random.seed` beside `random.randint(...)`, imported where the draw's own name was."""
    if isinstance(draw.func, ast.Attribute):
        return f"{ast.unparse(draw.func.value)}.seed"
    module = transform.anatomy.qualname(draw.func).rpartition(".")[0]
    transform.add_import(module.partition(".")[0])
    return f"{module}.seed"
