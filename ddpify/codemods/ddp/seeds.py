"""Seed every RNG alike on every rank where the ranks must draw the same numbers, as ddpify.codemods.seeds
does for every target.

Where the data a DistributedSampler shards is drawn from an unseeded RNG (`noise = np.random.normal(...)`,
`x = torch.randn(...)`), each rank would draw a data set of its own, and the shards would partition none:
`seed_everything(0)` goes before the first of those draws. Where the script asks for runs that repeat but
nothing seeds torch (lint's DDP024), it goes before the model; not where the rows of a full batch are shared
and torch is drawn from: that transform seeds it after the imports, since every rank must draw the same
data (codemods/ddp/rows.py), and a second seed would only repeat it.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import TORCH
from ddpify.anatomy.distributed.reaching import callers
from ddpify.anatomy.distributed.samplers import has_sampler_argument
from ddpify.anatomy.distributed.seeding import rng_drawn, unseeded_data_draws
from ddpify.anatomy.full_batch import trains_without_loader, unseeded_rngs
from ddpify.anatomy.sites import MODULE_SCOPE
from ddpify.anatomy.syntax import argument, enclosing_function
from ddpify.codemods.options import Options
from ddpify.codemods.seeds import SeedEveryRng, SeedWhereAskedFor


class SeedBeforeShardedData(SeedEveryRng):
    """`seed_everything(0)` before the first unseeded draw of the data a DistributedSampler will shard."""

    WHY = ("the data the DistributedSampler shards is drawn from {rngs}, seeded nowhere before: each rank would draw "
           "a data set of its own, and the shards would partition none")

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return _first_draw_statement(anatomy) is not None

    def plan(self) -> None:
        draws = sharded_data_draws(self.anatomy)
        self.WHY = self.WHY.format(rngs=" and ".join(dict.fromkeys(rng_drawn(self.anatomy.qualname(d.func) or "") for d in draws)))
        self.seed_before(_first_draw_statement(self.anatomy), draws[0].lineno, f"the data is drawn ({ast.unparse(draws[0].func)})")  # type: ignore[arg-type]


class SeedWhereReproducibilityIsAskedFor(SeedWhereAskedFor):
    """`seed_everything(0)` before the model where the script asks for it, unless the shared rows or the sharded data seed it."""

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        seeded_by_rows = trains_without_loader(anatomy) and TORCH in unseeded_rngs(anatomy)
        seeded_for_data = SeedBeforeShardedData.finds_work(anatomy, options)
        return super().finds_work(anatomy, options) and not seeded_by_rows and not seeded_for_data


@per_anatomy
def sharded_data_draws(a: Anatomy) -> list[ast.Call]:
    """The unseeded draws whose numbers the datasets of the training loaders (those given no sampler of their own) hold."""
    datasets = [argument(ld.call, 0, "dataset") for ld in a.train_loaders if not ld.built_elsewhere and not has_sampler_argument(ld)]
    draws = [draw for dataset in datasets if dataset is not None for draw in unseeded_data_draws(a, dataset)]
    return sorted(dict.fromkeys(draws), key=lambda call: (call.lineno, call.col_offset))


def _first_draw_statement(a: Anatomy) -> ast.stmt | None:
    """The statement of its scope's body that holds the first draw, where every draw is in that scope and the
    scope runs once (the module, or a function called from one place): a seed there runs before them all, once."""
    draws = sharded_data_draws(a)
    scopes = {enclosing_function(a, draw) for draw in draws}
    if len(scopes) != 1:
        return None
    scope = scopes.pop()
    if scope != MODULE_SCOPE and len(callers(a, scope)) > 1:
        return None
    body = a.tree.body if scope == MODULE_SCOPE else a.functions[scope].node.body
    return next(stmt for stmt in body if stmt.lineno <= draws[0].lineno <= stmt.end_lineno)  # type: ignore[operator]
