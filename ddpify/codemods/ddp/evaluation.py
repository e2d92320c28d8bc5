"""Sharded evaluation with reduced metrics, and training-loss prints averaged over ranks.

`--eval shard` (default): an evaluation loader whose loops only sum (or collect) their results gets
`sampler=evaluation_shard(len(dataset), batch_size)`, a contiguous run of whole batches of this
rank, unpadded (DistributedSampler would repeat samples to even out the shards and deal samples out
one by one, changing the batches), and each such loop is followed by `all_reduce_sums(...)` (numbers,
tensors, confusion matrices) and `all_gather_lists(...)` (predictions): every rank then holds the
whole set's sums, so the printed metric is the single-GPU one and decisions taken on it (best
checkpoint, early stopping, ReduceLROnPlateau) are the same on every rank. Ranks evaluate unequal
numbers of batches (a set of one batch: one rank evaluates nothing), so such a loop calls the module
inside the DDP wrapper (`eval_model = evaluation_module(model)`, rank 0's buffers broadcast first on
every rank): the wrapper's forward broadcasts buffers, a collective that would hang; a loop whose model
is called out of its sight stays whole. Any other evaluation loop
stays on the whole set, with advice. `--log-loss reduced` (default): a training-loss print shows
`mean_over_ranks(loss)`, computed just before the print (one all_reduce per print, not per step; a
print of several losses averages them all in that one: `d_avg, g_avg = mean_over_ranks(d, g)`).
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy.evaluation import EvaluationLoop, batch_size_code, evaluation_loops, loss_prints, model_reads, shardable
from ddpify.anatomy.syntax import identifier
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import (
    ADDED_FUNCTIONS,
    EVALUATION_HELPERS,
    GATHER_CALL,
    MEAN_CALL,
    MODULE_CALL,
    SHARD_CALL,
    SUMS_CALL,
)
from ddpify.codemods.ddp.samplers import SamplerTransform

_WHOLE = "evaluation left on the whole set on every rank (same metric as one GPU, no speed-up)"


class EvaluationSharding(SamplerTransform):
    """Shard evaluation loaders (whole batches, unpadded) and sum their metrics over ranks."""

    NAME = "evaluation"
    SEES_EDITS_OF = ()  # its helpers go after setup's, there or pending (add_helpers)

    def plan(self) -> None:
        super().plan()
        evaluations = evaluation_loops(self.anatomy)
        if not evaluations:
            return
        if self.options.eval == "whole":
            for evaluation in evaluations:
                self.advise(evaluation.loop.line, f"{_WHOLE} (--eval whole)")
            return
        loaders, loops = shardable(self.anatomy)
        for evaluation in evaluations:
            if evaluation not in loops:
                reason = evaluation.problem or "its loader is also iterated by a loop that can't be sharded"
                self.advise(evaluation.loop.line, f"{_WHOLE}: {reason}; to shard it, give the loader a per-rank sampler and all_reduce its sums by hand")
        if not loops or not add_helpers(self, _helpers_for(self.anatomy, loops)):
            return
        for loader in loaders:
            self._shard(loader)
        taken: set[str] = set()
        for evaluation in loops:
            self._reduce(evaluation)
            self._call_the_module(evaluation, taken)

    def _shard(self, loader) -> None:
        call = loader.call
        dataset = call.args[0] if call.args else next(kw.value for kw in call.keywords if kw.arg == "dataset")
        sampler = f"{SHARD_CALL}(len({self._dataset_code(dataset, 'eval_dataset')}), {batch_size_code(loader)})"
        self.rewrite_node(call, cst.Call, lambda node: self._with_sampler(node, sampler))
        self.changed(loader.line, "evaluation loader sharded: each rank evaluates a contiguous run of whole batches, unpadded")

    def _reduce(self, evaluation: EvaluationLoop) -> None:
        sums, lists = evaluation.summed, evaluation.gathered
        code = ""
        if sums:
            targets = ", ".join(sums) if len(sums) > 1 else f"({sums[0]},)"
            code += f"{targets} = {SUMS_CALL}({', '.join(sums)})\n"
        code += "".join(f"{name} = {GATHER_CALL}({name})\n" for name in lists)
        self.insert_after(evaluation.loop.node, code)  # type: ignore[arg-type]
        what = " and ".join(filter(None, [f"{', '.join(sums)} summed" if sums else "", f"{', '.join(lists)} gathered" if lists else ""]))
        self.changed(evaluation.loop.line, f"{what} over ranks after the evaluation loop: the metric is the whole set's, on every rank")


    def _call_the_module(self, evaluation: EvaluationLoop, taken: set[str]) -> None:
        """Each model the loop reads becomes the module inside its wrapper, taken just before the loop."""
        modules: dict[str, str] = {}
        for read in model_reads(self.anatomy, evaluation):
            wrapper = ast.unparse(read.model)
            if wrapper not in modules:
                modules[wrapper] = self.fresh_name(f"eval_{identifier(read.model)}", taken)
                self.insert_before(evaluation.loop.node, f"{modules[wrapper]} = {MODULE_CALL}({wrapper})\n")  # type: ignore[arg-type]
                self.changed(evaluation.loop.line, f"the evaluation loop calls {modules[wrapper]}, the module inside {wrapper}'s wrapper: ranks evaluate "
                             "unequal numbers of batches, and the wrapper's forward broadcasts buffers, a collective every rank must join")
            self.rewrite_expression(read.node, lambda _, name=modules[wrapper]: cst.Name(name))
            self.changed(read.node.lineno, f"{ast.unparse(read.node)} -> {modules[wrapper]} in the evaluation loop")


class ReducedLossPrints(Transform):
    """Print the training loss averaged over ranks (at print time only)."""

    NAME = "log-loss"
    SEES_EDITS_OF = ()  # its helpers go after setup's, there or pending (add_helpers)

    def plan(self) -> None:
        prints = loss_prints(self.anatomy) if self.options.log_loss == "reduced" else []
        if not prints or not add_helpers(self, {MEAN_CALL}):
            return
        taken: set[str] = set()
        for p in prints:
            renames = {name: self.fresh_name(f"{name}_avg", taken) for name in p.names}
            self.insert_before(p.stmt, f"{', '.join(renames.values())} = {MEAN_CALL}({', '.join(renames)})\n")
            self.rewrite_in_place(p.stmt, lambda stmt, r=renames: stmt.visit(_Renamer(r)))  # type: ignore[misc, return-value]
            self.changed(p.stmt.lineno, f"training loss printed as its mean over ranks ({', '.join(p.names)}; one all_reduce per print, not per step)")


def add_helpers(transform: Transform, names: set[str]) -> bool:
    """Queue the helpers in `names` the script lacks after the distributed setup, there already or
    planned in the same stage (False: no setup found)."""
    added = [transform.anatomy.functions[n].node for n in ADDED_FUNCTIONS if n in transform.anatomy.functions]
    missing = {name: code for name, code in EVALUATION_HELPERS.items() if name in names and name not in transform.anatomy.functions}
    if not added:
        if not transform.can_add_helpers():
            return False
        for name, code in missing.items():
            transform.add_helper(name, code)
        return True
    if missing:
        transform.insert_after(max(added, key=lambda fn: fn.lineno), "".join(missing.values()))
    return True


def _helpers_for(anatomy, loops: list[EvaluationLoop]) -> set[str]:
    sums, lists = any(e.summed for e in loops), any(e.gathered for e in loops)
    modules = any(model_reads(anatomy, e) for e in loops)
    return {SHARD_CALL} | ({SUMS_CALL} if sums else set()) | ({GATHER_CALL} if lists else set()) | ({MODULE_CALL} if modules else set())


class _Renamer(cst.CSTTransformer):
    """Reads of the named variables replaced by other names (in a print's arguments)."""

    def __init__(self, renames: dict[str, str]) -> None:
        super().__init__()
        self.renames = renames

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=self.renames.get(updated_node.value, updated_node.value))
