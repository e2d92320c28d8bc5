"""Each rank plays its own episodes, and every rank makes the same optimizer steps.

Reinforcement learning trains on what an environment plays (see ddpify.anatomy.environments), so
the data-parallel recipe is one environment per rank seeded with the rank (`env.reset(seed=s)` ->
`env.reset(seed=s + RANK)`; an unseeded environment already plays its own episodes), gradients
averaged by the DDP wrap (or by hand, for an optimizer its model owns: codemods/ddp/owned_optimizers.py),
output on rank 0. Episodes end at different steps on each rank, so the
tests that decide whether a rank steps (`if memory.size() > 2000:`) become `on_every_rank(...)`
and those that leave the episode loop (`if running_reward > threshold: break`) `on_any_rank(...)`:
one all_reduce of a flag each, so no rank waits in a gradient all_reduce for a step another never makes.
Where that can't be made so (a step inside the loop over one episode's steps, a method called from
where this file can't follow), or workers already train apart (A3C), the conversion is incomplete
with the recipe.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import Anatomy
from ddpify.anatomy.environments import environment_seeds, environments, episode_schedule, trains_on_environment, worker_processes
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.evaluation import add_helpers
from ddpify.codemods.ddp.runtime import ANY_CALL, EVERY_CALL, RANK
from ddpify.codemods.ddp.samplers import DistributedSamplers
from ddpify.codemods.options import Options

RECIPE = (f"give each rank its own environment seeded with the rank (env.reset(seed=seed + {RANK})), wrap the networks in "
          "DistributedDataParallel, and make every rank take the same number of optimizer steps (update on a fixed step "
          f"schedule, or agree on each update and each exit with an all_reduce of a flag, as {EVERY_CALL}() does)")


class EnvironmentsOfEachRank(Transform):
    """A seeded environment per rank, and the tests around each optimizer step agreed over the ranks."""

    NAME = "environments"
    SEES_EDITS_OF = ()  # its helper goes after setup's, there or pending (add_helpers)
    DUTY = DistributedSamplers.DUTY  # the same duty: each rank trains on data of its own

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return trains_on_environment(anatomy)

    def plan(self) -> None:
        a = self.anatomy
        for worker in worker_processes(a):
            self.missing(worker.line, "training runs in worker processes of the script's own (A3C style): it is already "
                                      "parallel, and DDP would not average its workers' updates", RECIPE)
        schedule = episode_schedule(a)
        for line, why in schedule.uneven:
            self.missing(line, f"the ranks may make a different number of optimizer steps ({why}): the all_reduce that "
                               "averages their gradients would hang", RECIPE)
        if worker_processes(a) or schedule.uneven or not add_helpers(self, {EVERY_CALL}):
            return
        for seed in environment_seeds(a):
            self.rewrite_expression(seed, _plus_rank)
            self.changed(seed.lineno, f"environment seed {ast.unparse(seed)} -> {ast.unparse(seed)} + {RANK}: each rank plays its own episodes")
        for test in schedule.every:
            self._agree(test, EVERY_CALL, "steps only where every rank does")
        for test in schedule.any:
            self._agree(test, ANY_CALL, "every rank leaves the loop where any rank does")
        self.advise(environments(a)[0].line, "each rank plays its own episodes, so the ranks' gradients average different "
                                             "experience: training is statistically, not exactly, equivalent to the "
                                             "original (`ddpify verify` can show no more)")
        self.fulfil()

    def _agree(self, test: ast.expr, helper: str, what: str) -> None:
        self.rewrite_expression(test, lambda node: cst.Call(cst.Name(helper), [cst.Arg(node)]))  # type: ignore[arg-type]
        self.changed(test.lineno, f"{ast.unparse(test)} -> {helper}(...): {what}, so each makes the same optimizer steps")


def _plus_rank(node: cst.CSTNode) -> cst.CSTNode:
    """`seed` -> `seed + RANK` (a conditional or a lambda in brackets first)."""
    if not isinstance(node, (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript, cst.BinaryOperation)):
        node = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(node, cst.Add(), cst.Name(RANK))  # type: ignore[arg-type]
