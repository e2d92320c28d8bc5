"""Compare the reference's record with the candidate ranks' records, step by step.

Exact mode: per step, the relative loss difference and the max relative parameter
difference (max|Δ| / max|ref|) are at most EXACT_TOLERANCE, and every rank holds the
same parameters. Plain BatchNorm under DDP on CPU or DataParallel's replicas stays exact:
the reference normalizes each rank's part of the batch separately (see rank_batchnorm).
Statistical mode (such BatchNorm fed a batch the ranks' parts cannot make up, or a GPU
candidate's plain BatchNorm where the reference expected SyncBatchNorm; float16/bfloat16
autocast under DDP or replicas, where a split batch rounds differently from the whole one; an FSDP2
mixed-precision policy with float16/bfloat16 parameters; random draws while training, unless every
rank drew exactly the reference's numbers, as a `get_batch()` drawing offsets does; a product pairing each
rank's rows with each other under DDP, as a pull-away term's `x @ x.T`, whose ranks miss the pairs across
them): losses within STATISTICAL_LOSS_TOLERANCE and ranks agree. Runs in the launcher, which has torch
imported already.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import torch

from ddpify.verify.alignment import RECUT_FLAG
from ddpify.verify.dataparallel import UNEVEN_FLAG
from ddpify.verify.plan import EXACT_TOLERANCE, PAIRS_FLAG, STATISTICAL_LOSS_TOLERANCE, UPDATE_TOLERANCE, WRAPPER_FLAG, Plan
from ddpify.verify.rank_batchnorm import SPLIT_FLAG, UNSPLIT_FLAG
from ddpify.verify.wrap_order import MOVED_FLAG
from ddpify.verify.result import error_result
from ddpify.verify.step_tensors import StepTensors

TINY = 1e-12


@dataclass
class StepRow:
    step: int
    loss_reference: float | None
    loss_candidate: float | None
    rel_loss: float | None
    max_rel_param: float | None  # None when the parameter counts differ
    update_rel_param: float | None  # ||Δparam|| / ||reference's total update||; None when unknown
    ranks_agree: bool
    problems: list[str]


@dataclass
class Record:
    """One process's record: its steps' parameters (float64) and gradients (float32) are read from their files
    one step at a time (StepTensors), so a comparison holds about one step of each side in memory."""

    losses: list[float | None]
    params: Sequence[torch.Tensor]
    flags: dict[str, str]
    notes: list[str]
    initial: torch.Tensor | None = None
    backward_losses: list[list[float]] = field(default_factory=list)  # per step, every backward's loss
    draws: list[str] = field(default_factory=list)  # fingerprints of the random draws made while training
    gradients: Sequence[torch.Tensor] = field(default_factory=list)  # per step: the gradients it applied

    @classmethod
    def load(cls, path: str) -> Record:
        with open(path, encoding="utf-8") as file:
            saved = json.load(file)
        folder = os.path.dirname(path) or "."
        initial = StepTensors(folder, saved["initial"], torch.float64)
        return cls(**{**saved, "params": StepTensors(folder, saved["params"], torch.float64),
                      "gradients": StepTensors(folder, saved["gradients"], torch.float32),
                      "initial": initial[0] if initial else None})


def largest_magnitude(tensor: torch.Tensor) -> float:
    """max|tensor|, without the copy `tensor.abs()` makes (a whole float64 step of a large model)."""
    return float(torch.linalg.vector_norm(tensor, float("inf")))


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b|; infinite when the shapes differ."""
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return largest_magnitude(a - b) / max(largest_magnitude(b), TINY)


def update_relative_difference(candidate: torch.Tensor, reference: torch.Tensor, initial: torch.Tensor | None) -> float | None:
    """||candidate - reference|| / ||reference - initial||: the error measured against the training so far."""
    if initial is None or candidate.shape != reference.shape or reference.shape != initial.shape:
        return None
    return float((candidate - reference).norm() / max(float((reference - initial).norm()), TINY))


def mean_loss(losses: list[float | None]) -> float | None:
    """The candidate's loss for a step: the mean of the ranks' (mean-reduced) losses."""
    known = [loss for loss in losses if loss is not None]
    return sum(known) / len(known) if known else None


def tolerances(statistical: bool) -> dict[str, float | None]:
    """The bound each per-step column is held to (None: not checked). A step's parameters pass when either
    max_rel_param or update_rel_param is within its bound."""
    return {"rel_loss": STATISTICAL_LOSS_TOLERANCE if statistical else EXACT_TOLERANCE,
            "max_rel_param": None if statistical else EXACT_TOLERANCE,
            "update_rel_param": None if statistical else UPDATE_TOLERANCE}


def compare_step(k: int, reference: Record, ranks: list[Record], statistical: bool) -> StepRow:
    """One table row, with the reasons this step fails (empty when it matches)."""
    ref_loss = reference.losses[k]
    cand_loss = mean_loss([rank.losses[k] for rank in ranks])
    rel_loss = None if ref_loss is None or cand_loss is None else abs(cand_loss - ref_loss) / max(abs(ref_loss), TINY)
    rel_param = relative_difference(ranks[0].params[k], reference.params[k])
    update_rel = update_relative_difference(ranks[0].params[k], reference.params[k], reference.initial)
    agree = all(relative_difference(rank.params[k], ranks[0].params[k]) <= EXACT_TOLERANCE for rank in ranks[1:])
    loss_tolerance = tolerances(statistical)["rel_loss"]
    problems = []
    if rel_loss is not None and rel_loss > loss_tolerance:
        problems.append(f"loss {cand_loss:.6g} vs reference {ref_loss:.6g} (rel diff {rel_loss:.1e} > {loss_tolerance:g})")
    if rel_param == float("inf"):
        problems.append(f"parameter count differs ({ranks[0].params[k].numel()} vs reference {reference.params[k].numel()})")
    elif not statistical and rel_param > EXACT_TOLERANCE and not (update_rel is not None and update_rel <= UPDATE_TOLERANCE):
        relative_to_update = f", {update_rel:.1e} of the update > {UPDATE_TOLERANCE:g}" if update_rel is not None else ""
        problems.append(f"max rel Δparam {rel_param:.1e} > {EXACT_TOLERANCE:g}{relative_to_update}")
    if not agree:
        problems.append("ranks hold different parameters (are gradients averaged? is the model wrapped in DDP "
                        "on this device?)")
    return StepRow(k + 1, ref_loss, cand_loss, rel_loss, None if rel_param == float("inf") else rel_param, update_rel, agree, problems)


def first_divergence(rows: list[StepRow], counts: list[int]) -> tuple[int, list[str]] | None:
    """(step, reasons) of the first mismatch, including runs of different lengths; None if none."""
    for row in rows:
        if row.problems:
            return row.step, row.problems
    if len(set(counts)) > 1:
        return min(counts) + 1, [f"the reference made {counts[0]} optimizer steps, the candidate {min(counts[1:])}"]
    return None


def _all_flags(records: list[Record]) -> dict[str, str]:
    flags: dict[str, str] = {}
    for record in records:
        for name, detail in record.flags.items():
            flags.setdefault(name, detail)
    return flags


def preconditions(plan: Plan, flags: dict[str, str]) -> list[str]:
    """Conditions under which the candidate cannot train like the reference."""
    found = []
    if plan.averages_across_ranks() and "sum_reduction" in flags:
        found.append(f"the loss uses {flags['sum_reduction']}: DDP averages gradients over {plan.nproc} ranks, "
                     f"so every update is {plan.nproc}x smaller than the single-process one "
                     f"(scale the loss or the learning rate by the world size, or use reduction='mean')")
    found += [flags[name] for name in ("indivisible_batch", UNEVEN_FLAG) if name in flags]
    return found


def same_data_on_every_rank(ranks: list[Record]) -> bool:
    """Did every rank compute bit-identical losses in every backward of more than one step? With the
    data sharded, the ranks' batches, and so the losses of their backwards, differ (one backward alone
    may not: a GAN's generator loss on noise that every rank draws alike)."""
    steps = [step for step in zip(*(rank.backward_losses for rank in ranks)) if all(step)]
    return len(ranks) > 1 and len(steps) > 1 and all(len({tuple(losses) for losses in step}) == 1 for step in steps)


def shared_draws(reference: Record, ranks: list[Record]) -> str | None:
    """Whom the ranks' random draws while training repeat: "reference" (every rank drew exactly the
    reference's numbers), "ranks" (every rank the same numbers, not the reference's), else None."""
    if not reference.draws or any(rank.draws != ranks[0].draws for rank in ranks[1:]):
        return None
    return "reference" if ranks[0].draws == reference.draws else "ranks" if len(ranks) > 1 else None


def judge(plan: Plan, reference: Record, ranks: list[Record]) -> dict:
    """The verdict, per-step rows, notes and preconditions, as a JSON-ready dict."""
    flags = _all_flags([reference, *ranks])
    notes = list(dict.fromkeys(note for record in (reference, *ranks) for note in record.notes))
    notes += _randomness_notes(plan, flags, shared_draws(reference, ranks))  # may take the randomness flag out
    statistical = (plan.splits_batches() and (bool({UNSPLIT_FLAG, "reduced_precision", "training_randomness", PAIRS_FLAG} & flags.keys())
                                              or _unsplit_plain_batchnorm(flags))
                   or "low_precision_parameters" in flags)
    notes += [flags[name] for name in ("dropout", "attention_dropout", "sample_randomness") if name in flags]
    if plan.splits_batches() and SPLIT_FLAG in flags:
        notes.append(_split_batchnorm_note(plan, flags[SPLIT_FLAG]))
    if statistical:
        notes.append(f"{_statistical_reason(plan, flags)}, so the runs are compared in statistical mode: "
                     f"losses within {STATISTICAL_LOSS_TOLERANCE:g} and ranks agree")
    found = preconditions(plan, flags)
    same_data = plan.averages_across_ranks() and not plan.loss_rows_shared and same_data_on_every_rank(ranks)
    not_recut = plan.aligns_reference() and RECUT_FLAG not in flags
    notes += _data_notes(plan, same_data, not_recut)
    counts = [len(reference.params), *(len(rank.params) for rank in ranks)]
    rows = [compare_step(k, reference, ranks, statistical) for k in range(min(counts))]
    result = {"mode": "statistical" if statistical else "exact", "steps": [asdict(row) for row in rows],
              "tolerances": tolerances(statistical), "notes": notes, "preconditions": found}
    if not counts[0]:
        return {**error_result("the reference made no optimizer step"), **result}
    if not plan.averages_by_hand and not any(WRAPPER_FLAG in rank.flags for rank in ranks):
        return {**result, "verdict": "not_converted", "diverged_at": None, "message": _not_converted_message(plan)}
    if MOVED_FLAG in flags:
        return {**result, "verdict": "diverged", "diverged_at": None, "message": _moved_after_wrap_message(flags[MOVED_FLAG])}
    if plan.plays_own_episodes:
        return _own_episodes_result(plan, ranks, counts, result)
    divergence = first_divergence(rows, counts)
    if divergence is None:  # no precondition held the runs apart (a summed loss scaled by WORLD_SIZE, say)
        caveat = ", but every rank trained on the same data (see notes)" if same_data else ""
        return {**result, "verdict": "equivalent", "diverged_at": None, "preconditions": [],
                "message": _equivalent_message(rows, plan, statistical) + caveat}
    amplified = None if statistical or found else amplified_noise(rows, reference, ranks[0])
    if amplified is not None:
        return _amplified_noise_result(plan, reference, ranks, rows, amplified, result)
    step, problems = divergence
    cause = (" (a precondition failed, see preconditions)" if found else
             " (the reference's batches were not re-cut to the ranks', see notes: verify cannot tell a wrong port "
             "from one that shards the data its own way)" if not_recut and not same_data else
             f" (every rank trained on the same data, the reference on the {plan.nproc} ranks' union: the data is not "
             f"sharded)" if same_data else "")
    message = f"diverged at step {step}{cause}: " + "; ".join(problems)
    return {**result, "verdict": "diverged", "diverged_at": step, "message": message}


@dataclass(frozen=True)
class AmplifiedNoise:
    """A step whose gradients matched the reference's while its update did not, in elements whose gradient
    is float noise only (see amplified_noise)."""

    step: int
    rel_gradient: float  # max|Δgrad| / max|reference's grad|
    elements: int  # parameter elements that moved apart
    noise: float  # the largest of their gradients, relative to the largest gradient


def amplified_noise(rows: list[StepRow], reference: Record, candidate: Record) -> AmplifiedNoise | None:
    """The first step whose parameters moved apart (max rel Δparam > EXACT_TOLERANCE), when every step before it
    matched exactly, its loss did too, its gradients match the reference's within EXACT_TOLERANCE of the largest,
    and every element that moved apart had a gradient within EXACT_TOLERANCE of zero (of the largest): float noise
    (a bias just before a BatchNorm has a gradient of exactly zero in theory), which an adaptive optimizer turns
    into a whole step (Adam's first step is lr * sign(grad)). A wrong conversion moves elements whose gradients
    are real. None when there is no such step."""
    moved = next((row for row in rows if row.max_rel_param is None or row.max_rel_param > EXACT_TOLERANCE), None)
    if moved is None or moved.max_rel_param is None or len(reference.gradients) < moved.step or len(candidate.gradients) < moved.step:
        return None
    if any(row.problems for row in rows[:moved.step - 1]) or not moved.ranks_agree \
            or (moved.rel_loss is not None and moved.rel_loss > EXACT_TOLERANCE):
        return None
    k = moved.step - 1
    grads, rel_gradient = reference.gradients[k], relative_difference(candidate.gradients[k], reference.gradients[k])
    apart = (candidate.params[k] - reference.params[k]).abs() > EXACT_TOLERANCE * max(largest_magnitude(reference.params[k]), TINY)
    largest = max(largest_magnitude(grads), TINY)
    noise = largest_magnitude(grads[apart]) / largest if apart.any() else 0.0
    if rel_gradient > EXACT_TOLERANCE or noise > EXACT_TOLERANCE:
        return None
    return AmplifiedNoise(moved.step, rel_gradient, int(apart.sum()), noise)


def _amplified_noise_result(plan: Plan, reference: Record, ranks: list[Record], rows: list[StepRow], noise: AmplifiedNoise,
                            result: dict) -> dict:
    """Exact up to `noise.step`'s gradients, statistical after: no later step can match exactly, whatever the port."""
    later = [compare_step(k, reference, ranks, statistical=True) for k in range(noise.step, len(rows))]
    rows = rows[:noise.step - 1] + [replace(rows[noise.step - 1], problems=[])] + later
    what = (f"steps 1-{noise.step - 1} match exactly, and " if noise.step > 1 else "") + (
        f"step {noise.step}'s gradients match the reference's (max rel Δgrad {noise.rel_gradient:.1e}, tolerance "
        f"{EXACT_TOLERANCE:g}), but its update moved {_elements(noise.elements)} apart whose gradients are float "
        f"noise (at most {noise.noise:.1e} of the largest; a bias just before a BatchNorm has none in theory), which the "
        f"optimizer turned into whole steps (Adam's first is lr * sign(grad)), so no later step can match exactly")
    result = {**result, "mode": "statistical", "steps": [asdict(row) for row in rows], "tolerances": tolerances(True),
              "notes": [*result["notes"], f"{what}: from step {noise.step + 1} the runs are compared in statistical mode "
                                          f"(losses within {STATISTICAL_LOSS_TOLERANCE:g}, ranks agree)"]}
    counts = [len(reference.params), *(len(rank.params) for rank in ranks)]
    divergence = first_divergence(rows, counts)
    if divergence is None:
        return {**result, "verdict": "equivalent", "diverged_at": None,
                "message": f"equivalent (exact through step {noise.step}'s gradients, then statistical: {_elements(noise.elements)} "
                           f"whose gradients are float noise took other optimizer steps, see notes): "
                           f"{len(rows)} steps, losses within {STATISTICAL_LOSS_TOLERANCE:g}, all {plan.nproc} ranks agree"}
    step, problems = divergence
    return {**result, "verdict": "diverged", "diverged_at": step, "message": f"diverged at step {step}: " + "; ".join(problems)}


def _elements(count: int) -> str:
    return f"{count} parameter element{'' if count == 1 else 's'}"


def _own_episodes_result(plan: Plan, ranks: list[Record], counts: list[int], result: dict) -> dict:
    """Reinforcement learning, each rank playing its own episodes: no step's loss compares with the
    reference's, so what is checked is that the ranks made the same optimizer steps and held the same
    parameters after each (the gradients averaged), and the verdict says so."""
    steps = min(counts[1:])
    disagree = next((k + 1 for k in range(steps) if any(relative_difference(rank.params[k], ranks[0].params[k]) > EXACT_TOLERANCE
                                                          for rank in ranks[1:])), None)
    result = {**result, "mode": "statistical", "steps": [], "preconditions": []}
    if len(set(counts[1:])) > 1:
        return {**result, "verdict": "diverged", "diverged_at": steps + 1,
                "message": f"diverged: the ranks made {sorted(set(counts[1:]))} optimizer steps (every rank must make the same)"}
    if disagree is not None:
        return {**result, "verdict": "diverged", "diverged_at": disagree,
                "message": f"diverged at step {disagree}: ranks hold different parameters (are gradients averaged?)"}
    return {**result, "verdict": "equivalent", "diverged_at": None,
            "message": f"equivalent (statistical: each rank plays its own episodes, so no step's loss compares with "
                       f"the reference's): the {plan.nproc} ranks made the same {steps} optimizer steps and held the same "
                       f"parameters after each (gradients averaged); the reference made {counts[0]}"}


def _moved_after_wrap_message(detail: str) -> str:
    """The verdict for a candidate that moves its model after the DDP wrap: right on CPU, broken on GPUs."""
    return (f"wrapped before its move: {detail}. On this CPU run the move changes nothing, but on GPUs DDP is built "
            f"on the parameters' old device (CPU), NCCL rejects them and gradients stop syncing: move the model to its "
            f"device before wrapping it")


def _not_converted_message(plan: Plan) -> str:
    """The verdict for a candidate whose steps were recorded but never ran a forward through its wrapper."""
    wrapper = {"dp": "nn.DataParallel", "ddp": "DistributedDataParallel", "fsdp": "a module sharded by fully_shard (or FSDP)",
               "accelerate": "the DistributedDataParallel that accelerator.prepare wraps it in"}
    return (f"not converted: the candidate never ran a forward through {wrapper[plan.target]}, so it trains as the single "
            f"process does and nothing multi-GPU was exercised, whatever its steps show (wrap the model that "
            f"training calls)")


def _data_notes(plan: Plan, same_data: bool, not_recut: bool) -> list[str]:
    """Where the compared batches come from, when it is not a re-cut DataLoader sharded over the ranks."""
    notes = []
    if not_recut:
        notes.append(f"no training DataLoader was re-cut (none fed training, or its sampling is its own), so the "
                     f"reference trains on the script's own batches, not the union of the {plan.nproc} ranks' parts")
    if same_data:
        notes.append(f"every rank computed the same losses at every step: the {plan.nproc} ranks train on the same "
                     f"data (it is not sharded), so they do the work of one process; shard the data by rank")
    return notes


def _randomness_notes(plan: Plan, flags: dict[str, str], shared: str | None) -> list[str]:
    """What the random draws made while training mean for the comparison. Draws that gave every rank
    exactly the reference's numbers do not keep the runs apart: their flag is taken out of `flags`."""
    if "training_randomness" not in flags or not plan.splits_batches():
        return []
    wrapper, part = _wrapper_and_part(plan)
    if shared == "reference":
        return [f"the script draws random numbers while it trains ({flags.pop('training_randomness')}), and every {part} "
                f"drew exactly the reference's numbers (the same seed and sizes, or its rows of the noise drawn for the "
                f"reference's batch: see aligned_draws), so they do not keep the runs apart"]
    if shared == "ranks":
        return [f"every {part} drew the same random numbers while training ({flags['training_randomness']}): under "
                f"{wrapper} the {plan.nproc} {part}s' draws repeat each other, where the one process draws fresh numbers for "
                f"its whole batch"]
    return []


def _unsplit_plain_batchnorm(flags: dict[str, str]) -> bool:
    """Did the candidate's ranks normalize with plain BatchNorm while the reference normalized whole batches
    (on GPUs, where the reference expects SyncBatchNorm: see Plan.ranks_normalize_apart)?"""
    return "plain_batchnorm" in flags and SPLIT_FLAG not in flags


def _statistical_reason(plan: Plan, flags: dict[str, str]) -> str:
    """Why exact comparison cannot hold between the reference and the ranks (or DataParallel's replicas)."""
    if "low_precision_parameters" in flags:
        return (f"the candidate's {flags['low_precision_parameters']} rounds the parameters for forward and backward, "
                f"where the reference computes with float32 ones")
    wrapper, part = _wrapper_and_part(plan)
    if PAIRS_FLAG in flags:
        return (f"a term of the loss pairs the batch's rows with each other ({flags[PAIRS_FLAG]}): under {wrapper} each "
                f"{part} pairs its own rows only, so the mean of the {part}s' terms misses the pairs across {part}s and is "
                f"not the whole batch's (a port that all-gathers the rows for it, torch.distributed.nn.functional."
                f"all_gather, keeps them)")
    if "training_randomness" in flags:
        return (f"the script draws random numbers while it trains ({flags['training_randomness']}): under {wrapper} each "
                f"{part} draws numbers for its part of the batch, not the reference's for the whole")
    if UNSPLIT_FLAG in flags:
        return (f"plain {flags[UNSPLIT_FLAG]}, so the reference cannot normalize it part by part as the {part}s "
                f"do under {wrapper}")
    if _unsplit_plain_batchnorm(flags):
        return (f"plain {flags['plain_batchnorm']} under {wrapper}: each {part} normalizes with its own batch "
                f"statistics (SyncBatchNorm would not)")
    return (f"{flags['reduced_precision']} under {wrapper}: each {part}'s part of the batch rounds differently from the "
            f"reference's whole batch")


def _wrapper_and_part(plan: Plan) -> tuple[str, str]:
    return ("DataParallel", "replica") if plan.target == "dp" else ("DDP", "rank")


def _split_batchnorm_note(plan: Plan, layer: str) -> str:
    wrapper, part = _wrapper_and_part(plan)
    return (f"plain {layer}: the reference normalizes each {part}'s part of the batch separately, as the "
            f"{plan.batch_parts} {part}s do under {wrapper} (running statistics from {part} 0's part)")


def _equivalent_message(rows: list[StepRow], plan: Plan, statistical: bool) -> str:
    ranks = f"all {plan.nproc} ranks agree" if plan.nproc > 1 else "one candidate process"
    if statistical:
        return (f"equivalent (statistical mode): {len(rows)} steps, losses within "
                f"{STATISTICAL_LOSS_TOLERANCE:g}, {ranks}")
    worst_param = max(row.max_rel_param for row in rows)
    worst_loss = max((row.rel_loss for row in rows if row.rel_loss is not None), default=0.0)
    if worst_param > EXACT_TOLERANCE:
        worst_update = max(row.update_rel_param for row in rows if row.update_rel_param is not None)
        return (f"equivalent: {len(rows)} steps match (max rel Δparam {worst_param:.1e}, but {worst_update:.1e} of the "
                f"update, tolerance {UPDATE_TOLERANCE:g}: float noise an adaptive optimizer amplifies; max rel Δloss "
                f"{worst_loss:.1e}), {ranks}")
    return (f"equivalent: {len(rows)} steps match (max rel Δparam {worst_param:.1e}, max rel Δloss "
            f"{worst_loss:.1e}, tolerance {EXACT_TOLERANCE:g}), {ranks}")
