"""Unit tests of verify's pieces that need no subprocess: alignment, comparison, diagnosis, report, plot."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

from ddpify.anatomy.vocabulary import RANDOM_DRAWS  # noqa: E402
from ddpify.verify.aligned_draws import seed_torch  # noqa: E402
from ddpify.verify.alignment import RECUT_FLAG, AlignedBatchSampler, LoaderCensus, align_training_loaders, is_training_loader  # noqa: E402
from ddpify.verify.compare import Record, judge  # noqa: E402
from ddpify.verify.dataparallel import simulate_data_parallel  # noqa: E402
from ddpify.verify.diagnose import SLOW_START, exception_line, exception_line_in, raise_location, stuck_at, stuck_in  # noqa: E402
from ddpify.verify.plan import WRAPPER_FLAG, Plan, Run  # noqa: E402
from ddpify.verify.rank_batchnorm import SPLIT_FLAG, UNSPLIT_FLAG, normalize_batchnorm_per_rank  # noqa: E402
from ddpify.verify.report import render  # noqa: E402
from ddpify.verify.result import exit_code  # noqa: E402
from ddpify.verify.runner import Request, training_loaders  # noqa: E402

SITE = ("/work/train.py", 12)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class Notes:
    """Stands in for recorder.Recorder: keeps notes and flags."""

    def __init__(self):
        self.notes, self.flags = [], {}

    def note(self, text):
        self.notes.append(text)

    def flag(self, name, detail):
        self.flags[name] = detail


def rank_batches(size, world, batch, epoch, shuffle=True):
    """What each DistributedSampler rank's DataLoader yields in `epoch`."""
    per_rank = []
    for rank in range(world):
        sampler = DistributedSampler(range(size), num_replicas=world, rank=rank, shuffle=shuffle)
        sampler.set_epoch(epoch)
        indices = list(sampler)
        per_rank.append([indices[i:i + batch] for i in range(0, len(indices), batch)])
    return per_rank


def union_of_rank_batches(size, world, batch, epoch, shuffle=True):
    per_rank = rank_batches(size, world, batch, epoch, shuffle)
    return [sum((batches[k] for batches in per_rank), []) for k in range(len(per_rank[0]))]


@pytest.mark.parametrize("size", [64, 70])  # 70: DistributedSampler pads, last batches are short
@pytest.mark.parametrize("shuffle", [True, False])
def test_aligned_sampler_yields_the_union_of_the_ranks_batches_epoch_after_epoch(size, shuffle):
    sampler = AlignedBatchSampler(SITE, size, 8, 8, False, shuffle, 2, LoaderCensus(set()), lambda s: None)
    for epoch in range(3):
        expected = union_of_rank_batches(size, 2, 8, epoch, shuffle)
        assert list(sampler) == expected
        assert len(sampler) == len(expected)


def test_a_loader_rebuilt_each_epoch_at_the_same_site_keeps_counting_epochs():
    census = LoaderCensus(set())
    epochs = [list(AlignedBatchSampler(SITE, 16, 4, 4, False, True, 2, census, lambda s: None)) for _ in range(2)]
    assert epochs == [union_of_rank_batches(16, 2, 4, 0), union_of_rank_batches(16, 2, 4, 1)]


def test_epochs_count_from_where_the_candidates_epoch_loop_starts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "model = torch.nn.Linear(2, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(list(range(8)), batch_size=2, shuffle=True)\n"
        "for epoch in range(1, 4):\n    for x in loader:\n        optimizer.step()\n"
    )
    assert training_loaders(str(script)) == {5: ((6, 8, 1),)}
    census = LoaderCensus(set(), {SITE: [(20, 30, 1)]})
    epochs = [list(AlignedBatchSampler(SITE, 16, 4, 4, False, True, 2, census, lambda s: None)) for _ in range(2)]
    assert epochs == [union_of_rank_batches(16, 2, 4, 0), union_of_rank_batches(16, 2, 4, 0)]  # not run inside the loop
    assert [census.next_epoch(SITE, {25}) for _ in range(2)] == [1, 2]


def test_a_pass_before_the_epoch_loop_keeps_the_epoch_its_first_iteration_sets_again():
    census = LoaderCensus(set(), {SITE: [(20, 30, 0)]})
    assert [census.next_epoch(SITE, {15}), census.next_epoch(SITE, {25}), census.next_epoch(SITE, {25})] == [0, 0, 1]
    assert census.next_epoch(SITE, {35}) == 1  # after the loop: the epoch last set
    unknown = LoaderCensus(set())
    assert [unknown.next_epoch(SITE, {25}) for _ in range(3)] == [0, 1, 2]  # no epoch loop known: one epoch per pass


def test_training_loaders_are_the_shuffled_the_static_and_else_the_first_used_before_a_step():
    census = LoaderCensus({SITE})
    other = ("/work/train.py", 30)
    assert is_training_loader(other, True, census)
    assert is_training_loader(SITE, False, census)
    assert is_training_loader(other, False, LoaderCensus(set()))
    census = LoaderCensus(set())
    census.known_training = 1
    assert not is_training_loader(other, False, census)
    census = LoaderCensus(set())
    census.optimizer_stepped = True
    assert not is_training_loader(other, False, census)


def test_an_unshuffled_loader_used_after_the_training_loader_keeps_its_own_batches():
    census = LoaderCensus(set())
    train = AlignedBatchSampler(SITE, 16, 4, 4, False, False, 2, census, lambda s: None)
    evaluation = AlignedBatchSampler(("/work/train.py", 13), 10, 4, 4, False, False, 2, census, lambda s: None)
    assert list(train) == union_of_rank_batches(16, 2, 4, 0, shuffle=False)
    assert list(evaluation) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_patched_dataloader_serves_the_reference_the_ranks_union(monkeypatch):
    monkeypatch.setattr(DataLoader, "__init__", DataLoader.__init__)  # undone after the test
    notes = Notes()
    align_training_loaders(2, "global", set(), notes)
    dataset = TensorDataset(torch.arange(32))
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    assert [batch[0].tolist() for batch in loader] == union_of_rank_batches(32, 2, 4, 0)
    assert any("2 ranks x batch 4" in note for note in notes.notes)
    DataLoader(dataset, batch_size=7, shuffle=True)
    assert "not divisible by 2 ranks" in notes.flags["indivisible_batch"]


def make_plan(target="ddp", nproc=2, **fields):
    run = Run("/work/train.py", "/work", "/tmp", 1)
    candidate = Run("/work/t.py", "/work", "/tmp", nproc)
    return Plan(target, 3, "cpu", "per-gpu", 60.0, "fork", "/tmp", (), run, candidate, **fields)


WRAPPED = {WRAPPER_FLAG: "DistributedDataParallel"}  # a forward ran through the candidate's wrapper


def record(losses, params, flags=None):
    return Record(losses, [torch.tensor(p, dtype=torch.float64) for p in params], {**WRAPPED, **(flags or {})}, [],
                  backward_losses=[[loss] for loss in losses])


STEPS = [[1.0, 2.0], [1.1, 2.1], [1.2, 2.2]]


def test_identical_records_are_equivalent():
    result = judge(make_plan(), record([3.0, 2.0, 1.0], STEPS), [record([3.0, 2.0, 1.0], STEPS)] * 2)
    assert (result["verdict"], result["mode"]) == ("equivalent", "exact")
    assert result["message"].startswith("equivalent: 3 steps match")


def test_ranks_that_saw_the_same_data_are_named():
    same = judge(make_plan(), record([3.0, 2.0, 1.0], STEPS), [record([3.0, 2.0, 1.0], STEPS)] * 2)
    sharded = judge(make_plan(), record([3.0, 2.0, 1.0], STEPS), [record([2.9, 2.1, 1.0], STEPS), record([3.1, 1.9, 1.0], STEPS)])
    assert any("train on the same data" in note for note in same["notes"])
    unsharded = judge(make_plan(), record([3.0, 2.0, 1.0], STEPS, {RECUT_FLAG: "t.py:3"}), [record([2.0, 2.0, 1.0], STEPS)] * 2)
    assert unsharded["message"].startswith("diverged at step 1 (every rank trained on the same data, the reference on "
                                           "the 2 ranks' union: the data is not sharded)")
    assert not any("same data" in note for note in sharded["notes"])
    assert same["verdict"] == sharded["verdict"] == "equivalent"  # the training matches; the note says what it cost


def test_first_step_beyond_tolerance_is_named():
    drifted = [STEPS[0], STEPS[1], [1.2, 2.3]]
    ranks = [record([3.0, 2.0, 1.0], drifted)] * 2
    result = judge(make_plan(), record([3.0, 2.0, 1.0], STEPS), ranks)
    assert (result["verdict"], result["diverged_at"]) == ("diverged", 3)
    assert "max rel Δparam 4.5e-02" in result["message"]


def test_ranks_that_disagree_diverge():
    other = [[1.0, 2.0], [1.1, 2.1], [1.2, 2.25]]
    result = judge(make_plan(), record([1, 1, 1], STEPS), [record([1, 1, 1], STEPS), record([1, 1, 1], other)])
    assert result["diverged_at"] == 3
    assert "ranks hold different parameters" in result["message"]


def test_runs_of_different_lengths_diverge_after_the_shorter():
    result = judge(make_plan(), record([1, 1, 1], STEPS), [record([1, 1], STEPS[:2])] * 2)
    assert result["diverged_at"] == 3
    assert "the reference made 3 optimizer steps, the candidate 2" in result["message"]


def test_an_equivalent_verdict_lists_no_precondition_and_batchnorm_the_reference_did_not_split_is_statistical():
    """On GPUs the reference expects SyncBatchNorm and normalizes whole batches: a port keeping plain BatchNorm
    matches it only statistically."""
    ranks = [record([1.0, 1.0, 1.0], [[1.0, 2.0], [1.5, 2.5], [1.0, 2.0]], {"plain_batchnorm": "BatchNorm2d"})] * 2
    result = judge(make_plan(), record([1.01, 1.0, 1.0], STEPS, {"sum_reduction": "mse_loss(reduction='sum')"}), ranks)
    assert (result["verdict"], result["mode"], result["preconditions"]) == ("equivalent", "statistical", [])
    assert any("BatchNorm2d under DDP: each rank normalizes" in note for note in result["notes"])


def test_random_draws_in_forward_switch_to_statistical_mode_and_say_which():
    ranks = [record([1.0, 1.0, 1.0], [[1.0, 2.0], [1.5, 2.5], [1.0, 2.0]], {"training_randomness": "torch.randn_like in a forward"})] * 2
    result = judge(make_plan(), record([1.01, 1.0, 1.0], STEPS), ranks)
    assert (result["verdict"], result["mode"]) == ("equivalent", "statistical")
    assert any("draws random numbers while it trains (torch.randn_like in a forward)" in note for note in result["notes"])


@pytest.fixture
def watched_draws(recorder):
    """watch_training_randomness installed on `recorder`; torch's and numpy's draw functions restored after the test."""
    import numpy

    from ddpify.verify.harness import watch_training_randomness
    saved_torch = {name: getattr(torch, name) for name in RANDOM_DRAWS}
    saved_numpy = dict(vars(numpy.random))
    watch_training_randomness(recorder)
    yield recorder
    vars(numpy.random).update(saved_numpy)
    for name, function in saved_torch.items():
        setattr(torch, name, function)


def test_random_draws_are_flagged_once_training_forwards_record(watched_draws):
    recorder = watched_draws
    torch.randn(2)  # before training: the data
    with torch.no_grad():
        NoisyLayer()(torch.ones(2))
    torch.randperm(4, generator=torch.Generator())  # a sampler's own generator
    assert "training_randomness" not in recorder.flags
    NoisyLayer()(torch.ones(2))
    assert recorder.flags["training_randomness"].startswith("torch.randn_like in a forward, in forward() at test_verify_units.py:")
    recorder.flags.clear()
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        torch.randn(2)  # a GAN's noise for the next step, a get_batch's offsets
    assert recorder.flags["training_randomness"].startswith("torch.randn between training steps, in "
                                                           "test_random_draws_are_flagged_once_training_forwards_record() at ")
    forward_noise, first, again, other = recorder.draws
    assert first == again != other and first.startswith("(2,) torch.float32 ")


def test_numpy_draws_are_flagged_and_fingerprinted_but_not_in_a_seeded_sample(watched_draws):
    import numpy as np

    from ddpify.verify.harness import SeededSample
    recorder = watched_draws
    np.random.choice(8, 2)  # before training: the data
    NoisyLayer()(torch.ones(2))
    recorder.flags.clear()
    recorder.draws.clear()
    SeededSample.depth += 1
    try:
        np.random.normal()  # a Dataset's augmentation, seeded per sample
    finally:
        SeededSample.depth -= 1
    assert "training_randomness" not in recorder.flags and not recorder.draws
    for seed in (1, 1, 2):
        np.random.seed(seed)
        np.random.choice(8, 2)  # rows picked for the next step
    assert recorder.flags["training_randomness"].startswith("numpy.random.choice between training steps, in "
                                                           "test_numpy_draws_are_flagged_and_fingerprinted_but_not_in_a_seeded_sample() at ")
    shuffled = []
    for seed in (1, 2):
        rows = np.arange(8)
        np.random.seed(seed)
        np.random.shuffle(rows)  # draws into its argument, returns None
        shuffled.append(rows)
    first, again, other, shuffle_1, shuffle_2 = recorder.draws
    assert first == again != other and first.startswith("ndarray ")
    assert shuffle_1 != shuffle_2 and not (shuffled[0] == shuffled[1]).all()


def drawing(losses, params, draws, backward_losses=None, flags=None):
    """A record whose training drew random numbers (fingerprints `draws`), with each step's backward losses."""
    made = record(losses, params, {"training_randomness": "torch.randint between training steps, in get_batch() at t.py:9",
                                   RECUT_FLAG: "t.py:3", **(flags or {})})
    made.draws = draws
    made.backward_losses = backward_losses or made.backward_losses
    return made


def test_draws_that_repeat_the_references_on_every_rank_keep_the_comparison_exact():
    result = judge(make_plan(), drawing([1, 1, 1], STEPS, ["a", "b"]), [drawing([1, 1, 1], STEPS, ["a", "b"])] * 2)
    assert (result["verdict"], result["mode"]) == ("equivalent", "exact")
    assert any("(torch.randint between training steps, in get_batch() at t.py:9), and every rank drew exactly the "
               "reference's numbers" in note for note in result["notes"])


def test_draws_the_ranks_repeat_but_the_reference_does_not_are_statistical_and_said_so():
    result = judge(make_plan(), drawing([1, 1, 1], STEPS, ["whole"]), [drawing([1, 1, 1], STEPS, ["half"])] * 2)
    assert result["mode"] == "statistical"
    assert any("the 2 ranks' draws repeat each other" in note for note in result["notes"])


def test_seeding_a_sample_seeds_the_cpu_generator_without_queueing_seeds_for_absent_devices(monkeypatch):
    """seed_torch draws as torch.manual_seed does on the CPU. It formats no stack: torch.manual_seed does,
    three times, while CUDA has not started (1-2 ms a call, once per sample of every batch)."""
    torch.manual_seed(7)
    expected = torch.rand(3)
    monkeypatch.setattr(traceback, "format_stack", lambda *args: pytest.fail("a stack was formatted"))
    seed_torch(7)
    assert torch.equal(torch.rand(3), expected)


@pytest.fixture
def seeded_samples(monkeypatch) -> Notes:
    """seed_each_sample in place (put back after the test); the notes and flags it records."""
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    from ddpify.verify.harness import seed_each_sample

    monkeypatch.setattr(_MapDatasetFetcher, "fetch", _MapDatasetFetcher.fetch)
    monkeypatch.setattr(DataLoader, "__iter__", DataLoader.__iter__)
    recorder = Notes()
    seed_each_sample(recorder)
    return recorder


def test_a_samples_draws_follow_its_index_and_a_batch_leaves_the_global_generators_as_it_found_them(seeded_samples):
    """seed_each_sample: the same index draws the same numbers in any batch; after a batch (before its
    collate_fn) Python's, torch's and NumPy's global states are those it began with; a drawing dataset is flagged."""
    import random

    import numpy as np
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    class Noisy(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.rand(1) + random.random() + float(np.random.rand())

    def states():
        return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].tolist()

    seen = {}

    def collate(items):
        seen["states"] = states()
        return torch.cat(items)

    def fetch(indices):
        return _MapDatasetFetcher(Noisy(), True, collate, False).fetch(indices)

    before = states()
    whole = fetch([0, 1, 2, 3])
    assert seen["states"][1:] == before[1:] and torch.equal(seen["states"][0], before[0])
    after = states()
    assert after[1:] == before[1:] and torch.equal(after[0], before[0])
    assert torch.equal(torch.cat([fetch([0, 1]), fetch([2, 3])]), whole)
    assert "sample_randomness" in seeded_samples.flags


SAMPLE_DRAWS = {
    "nothing": lambda np, random: 0.0,
    "torch": lambda np, random: float(torch.rand(1)),
    "python": lambda np, random: random.random(),
    "numpy": lambda np, random: float(np.random.rand()),
    # exactly one round of NumPy's 624 key words: its position is back where seeding left it, its key renewed
    "numpy, 624 words": lambda np, random: float(np.random.randint(0, 2**32, size=624, dtype=np.uint32)[0]),
}


@pytest.mark.parametrize("draw", SAMPLE_DRAWS)
def test_a_dataset_is_flagged_as_drawing_whichever_global_generator_it_draws_from(seeded_samples, draw):
    """seed_each_sample flags a dataset whose samples draw (from torch's, Python's or NumPy's generator,
    NumPy's read in place; its mark agrees with get_state()) and leaves one that draws nothing unflagged."""
    import random

    import numpy as np
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    from ddpify.verify.harness import _numpy_mark

    class Drawing(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return torch.tensor([SAMPLE_DRAWS[draw](np, random)])

    _MapDatasetFetcher(Drawing(), True, torch.cat, False).fetch([0, 1])
    assert ("sample_randomness" in seeded_samples.flags) == (draw != "nothing")
    state = np.random.get_state()
    assert _numpy_mark(np) == (int(state[1][0]), int(state[2]))


def test_ranks_with_one_loss_alike_but_another_apart_do_not_train_on_the_same_data():
    """A GAN: the generator's loss on noise every rank draws alike, the discriminator's on each rank's real batch."""
    ranks = [drawing([1, 1, 1], STEPS, ["n"], [[real, 1.0]] * 3) for real in (0.5, 0.7)]
    result = judge(make_plan(), drawing([1, 1, 1], STEPS, ["N"]), ranks)
    assert not any("same data" in note for note in result["notes"])


def test_data_no_loader_fed_is_named_and_its_divergence_is_verifys_limit():
    no_loader = {"training_randomness": "torch.randint between training steps, in get_batch() at t.py:9"}
    same = judge(make_plan(), record([1, 1, 1], STEPS, no_loader), [record([1, 1, 1], STEPS, no_loader)] * 2)
    assert same["verdict"] == "equivalent" and same["message"].endswith(", but every rank trained on the same data (see notes)")
    assert any(note.startswith("no training DataLoader was re-cut") for note in same["notes"])
    ranks = [record([1.5, 1, 1], [[1.0, 2.5], *STEPS[1:]]), record([0.5, 1, 1], [[1.0, 2.5], *STEPS[1:]])]
    apart = judge(make_plan(), record([1, 1, 1], STEPS), ranks)
    assert apart["message"].startswith("diverged at step 1 (the reference's batches were not re-cut to the ranks', see notes: "
                                       "verify cannot tell a wrong port from one that shards the data its own way)")


class NoisyLayer(torch.nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


def test_batchnorm_the_reference_split_per_rank_is_compared_exactly_and_said_so():
    ranks = [record([1.0, 1.0, 1.0], STEPS, {"plain_batchnorm": "BatchNorm2d"})] * 2
    split = record([1.0, 1.0, 1.0], STEPS, {SPLIT_FLAG: "BatchNorm2d"})
    result = judge(make_plan(), split, ranks)
    assert (result["verdict"], result["mode"]) == ("equivalent", "exact")
    assert "plain BatchNorm2d: the reference normalizes each rank's part of the batch separately, as the 2 ranks do " \
           "under DDP (running statistics from rank 0's part)" in result["notes"]
    drifted = [record([1.0, 1.02, 1.0], STEPS, {"plain_batchnorm": "BatchNorm2d"})] * 2  # within the old 5%
    assert judge(make_plan(), split, drifted)["diverged_at"] == 2


def test_batchnorm_input_the_ranks_parts_cannot_make_up_is_statistical():
    unsplit = "BatchNorm1d normalized a batch of 5, which 2 ranks' equal parts cannot make up"
    flags = {SPLIT_FLAG: "BatchNorm1d", UNSPLIT_FLAG: unsplit}
    result = judge(make_plan(), record([1.0, 1.0, 1.0], STEPS, flags), [record([1.0, 1.01, 1.0], STEPS)] * 2)
    assert (result["verdict"], result["mode"]) == ("equivalent", "statistical")
    assert any("a batch of 5" in note and "part by part" in note for note in result["notes"])


def test_reduced_precision_autocast_switches_ddp_to_statistical_mode():
    """fp16/bf16 matmuls round differently for a batch and its halves (seen on an H100: Δparam 3e-3)."""
    flags = {"reduced_precision": "autocast('cuda', torch.bfloat16)"}
    drifted = [[1.0, 2.0], [1.1, 2.1003], [1.2, 2.2006]]
    result = judge(make_plan(), record([1.0, 1.0, 1.0], STEPS, flags), [record([1.0, 1.0, 1.0], drifted, flags)] * 2)
    assert (result["verdict"], result["mode"]) == ("equivalent", "statistical")
    assert any("autocast('cuda', torch.bfloat16) under DDP" in note for note in result["notes"])
    single = judge(make_plan(nproc=1), record([1.0, 1.0, 1.0], STEPS, flags), [record([1.0, 1.0, 1.0], drifted, flags)])
    assert (single["verdict"], single["mode"]) == ("diverged", "exact")


def test_dataparallel_has_no_sum_precondition_and_compares_split_batchnorm_exactly_over_replicas():
    reference = record([1, 1, 1], STEPS, {SPLIT_FLAG: "BatchNorm2d", "sum_reduction": "x"})
    candidate = [record([1, 1, 1], STEPS, {"plain_batchnorm": "BatchNorm2d", "sum_reduction": "x"})]
    one_gpu = judge(make_plan("dp", 1, dp_replicas=1), reference, candidate)
    assert (one_gpu["mode"], one_gpu["preconditions"]) == ("exact", [])
    replicas = judge(make_plan("dp", 1, dp_replicas=2, dp_simulated=True), reference, candidate)
    assert (replicas["mode"], replicas["preconditions"]) == ("exact", [])
    assert any("each replica's part of the batch separately, as the 2 replicas do under DataParallel" in note
               for note in replicas["notes"])


@pytest.mark.parametrize(("target", "wrapper"), [("dp", "nn.DataParallel"), ("ddp", "DistributedDataParallel"),
                                                 ("fsdp", "fully_shard")])
def test_a_candidate_that_never_ran_a_wrapper_forward_is_not_converted_though_its_steps_match(target, wrapper):
    unwrapped = Record([3.0, 2.0, 1.0], [torch.tensor(p, dtype=torch.float64) for p in STEPS], {}, [])
    result = judge(make_plan(target, 1), record([3.0, 2.0, 1.0], STEPS), [unwrapped])
    assert (result["verdict"], exit_code(result)) == ("not_converted", 3)
    assert result["message"].startswith(f"not converted: the candidate never ran a forward through ")
    assert wrapper in result["message"] and all(not row["problems"] for row in result["steps"])


@pytest.mark.parametrize(("target", "device", "fields", "apart"), [
    ("ddp", "cpu", {}, True), ("fsdp", "cpu", {}, True), ("ddp", "cuda", {}, False),  # GPUs: SyncBatchNorm
    ("dp", "cuda", {"dp_replicas": 2}, True), ("dp", "cpu", {"dp_replicas": 1}, False)])
def test_the_reference_splits_batchnorm_where_the_candidates_parts_normalize_apart(target, device, fields, apart):
    plan = make_plan(target, 1 if target == "dp" else 2, **fields)
    plan = Plan(**{**vars(plan), "device": device})
    assert plan.ranks_normalize_apart() is apart


class CountingNet(torch.nn.Module):
    """Linear + BatchNorm whose forward counts its calls and can return a loss."""

    def __init__(self):
        super().__init__()
        self.linear, self.norm, self.calls = torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2), 0

    def forward(self, x, target=None):
        self.calls += 1
        out = self.norm(self.linear(x))
        return out if target is None else {"loss": torch.nn.functional.mse_loss(out, target), "out": out}


def test_simulated_dataparallel_scatters_replicates_and_gathers_like_two_gpus(monkeypatch):
    monkeypatch.setattr(torch.nn.DataParallel, "__init__", torch.nn.DataParallel.__init__)
    monkeypatch.setattr(torch.nn.DataParallel, "forward", torch.nn.DataParallel.forward)
    flags = {}
    simulate_data_parallel(2, flags.setdefault)
    torch.manual_seed(0)
    model, alone = CountingNet(), CountingNet()
    alone.load_state_dict(model.state_dict())
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    with pytest.warns(UserWarning, match="scalars"):
        gathered = torch.nn.DataParallel(model)(x, target=y)
    chunks = [alone(x[:3], y[:3]), alone(x[3:], y[3:])]  # Tensor.chunk: 3 + 2
    assert gathered["loss"].shape == (2,) and torch.allclose(gathered["loss"], torch.stack([c["loss"] for c in chunks]))
    assert torch.allclose(gathered["out"], torch.cat([c["out"] for c in chunks]))
    gathered["loss"].mean().backward()
    torch.stack([c["loss"] for c in chunks]).mean().backward()
    assert all(torch.allclose(a.grad, b.grad) for a, b in zip(model.parameters(), alone.parameters()))
    assert model.calls == 0  # set on the replicas, lost with them
    assert model.norm.num_batches_tracked.item() == 1  # replica 0 shares the buffers, the others copy them
    assert "a batch of 5 into 3 + 2 and forward returned a scalar per replica" in flags["uneven_replica_losses"]



def test_simulated_dataparallel_puts_the_chunks_on_the_models_device(monkeypatch):
    """As DataParallel puts each chunk on its GPU: a forward that leaves its CPU input where it is
    gets it on the model's device (cuda:0 on a one-GPU machine; here the meta device stands in)."""
    monkeypatch.setattr(torch.nn.DataParallel, "__init__", torch.nn.DataParallel.__init__)
    monkeypatch.setattr(torch.nn.DataParallel, "forward", torch.nn.DataParallel.forward)
    simulate_data_parallel(2)
    model = torch.nn.Linear(3, 2, device="meta")
    for batch in (1, 5):  # one chunk, two chunks
        out = torch.nn.DataParallel(model)(torch.randn(batch, 3))
        assert out.device.type == "meta" and out.shape == (batch, 2)



class AdjacencyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, features, adj):
        return adj @ self.linear(features)


def test_a_forward_that_needs_an_input_whole_fails_under_simulated_dataparallel_with_the_reason(monkeypatch):
    """A graph's adjacency split by rows no longer lines up with the features: verify names DataParallel's split."""
    from ddpify.verify.dataparallel import SPLIT_INPUT_HINT, failure_hint

    monkeypatch.setattr(torch.nn.DataParallel, "__init__", torch.nn.DataParallel.__init__)
    monkeypatch.setattr(torch.nn.DataParallel, "forward", torch.nn.DataParallel.forward)
    simulate_data_parallel(2)
    with pytest.raises(RuntimeError) as error:
        torch.nn.DataParallel(AdjacencyNet())(torch.randn(6, 3), torch.eye(6))
    assert failure_hint(f"RuntimeError: {error.value}") == SPLIT_INPUT_HINT
    assert failure_hint("RuntimeError: CUDA out of memory") is None


DUMP = """Timeout (0:00:20)!
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
Thread 0x00007f0000000002 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 4811 in barrier
  File "/work/ddp.py", line 34 in train
  File "/work/ddp.py", line 50 in main
  File "/work/ddp.py", line 60 in <module>
"""


def test_a_hang_is_reduced_to_the_call_it_waits_in_and_the_scripts_frames(tmp_path):
    dump = tmp_path / "stack.txt"
    dump.write_text(DUMP)
    stuck = stuck_in(str(dump), ("/work",))
    assert [(frame.line, frame.function) for frame in stuck.script] == [(34, "train"), (50, "main"), (60, "<module>")]
    assert str(stuck) == "at ddp.py:34 in train, waiting in barrier (torch/distributed/distributed_c10d.py:4811)"
    assert str(stuck_in(str(dump), ("/elsewhere",))) == "waiting in barrier (torch/distributed/distributed_c10d.py:4811)"
    assert stuck_in(str(tmp_path / "missing.txt"), ("/work",)) is None


def cut_import_dump(script_frames: str) -> str:
    """A dump taken inside a deep import, cut by faulthandler 100 frames in, with `script_frames` left in."""
    importing = ('  File "/site-packages/torch/distributed/tensor/_ops/_pointwise_ops.py", line 119 in _register_single_dim_pointwise\n'
                 '  File "/site-packages/torch/distributed/tensor/_ops/_pointwise_ops.py", line 140 in <module>\n')
    loading = '  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed\n' * (98 - script_frames.count("\n"))
    return f"Timeout (0:00:08)!\nThread 0x01 (most recent call first):\n{importing}{loading}{script_frames}  ...\n"


def test_a_process_inside_a_library_import_is_still_starting_up():
    """An import at the deadline (the DDP wrap's first import of torch._dynamo takes seconds) is a slow start,
    named by the module it loads, even where the dump, cut 100 frames in, lost the script's frames."""
    from ddpify.verify.launcher import still_importing

    cut = stuck_at(cut_import_dump(""), ("/work",))
    assert (cut.script, cut.importing) == ((), "torch/distributed/tensor/_ops/_pointwise_ops.py")
    assert still_importing("rank 1", cut, 8) == ("rank 1 was still importing torch/distributed/tensor/_ops/_pointwise_ops.py "
                                                 "8 s after launch, deeper than its stack dump reaches " + SLOW_START)
    wrapping = stuck_at(cut_import_dump('  File "/work/ddp.py", line 28 in main\n'), ("/work",))
    assert wrapping.importing == "torch/distributed/tensor/_ops/_pointwise_ops.py"
    assert still_importing("rank 0", wrapping, 8).endswith("8 s after launch, for ddp.py:28 in main " + SLOW_START)
    assert stuck_at(DUMP, ("/work",)).importing is None  # waits in a barrier: a hang


def test_the_scripts_own_module_hanging_as_it_is_imported_is_a_hang():
    dump = ('Thread 0x01 (most recent call first):\n  File "/site-packages/torch/distributed/distributed_c10d.py", line 9 in barrier\n'
            '  File "/work/data.py", line 3 in <module>\n  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed\n'
            '  File "/work/train.py", line 1 in <module>\n')
    stuck = stuck_at(dump, ("/work",))
    assert (str(stuck), stuck.importing) == ("at data.py:3 in <module>, waiting in barrier (torch/distributed/distributed_c10d.py:9)", None)


def test_a_hang_at_a_line_the_converter_wrote_names_that_change(tmp_path):
    from ddpify.convert import convert_source
    from ddpify.verify.launcher import hang_report
    from ddpify.verify.runner import _changes_by_line

    conversion = convert_source((FIXTURES / "basic_main.py").read_text(), "ddp", path="basic_main.py")
    script = tmp_path / "basic_main_ddp.py"
    script.write_text(conversion.output)
    plan = Plan(**{**vars(make_plan()), "changes": tuple(_changes_by_line({str(script): (Path("basic_main.py"), conversion)}))})
    wrap = next(n for n, text in enumerate(conversion.output.splitlines(), 1) if text.strip().startswith("model = DDP("))
    dump = (f'Thread 0x01 (most recent call first):\n  File "/torch/nn/parallel/distributed.py", line 9 in __init__\n'
            f'  File "{script}", line {wrap} in main\n')
    hang = hang_report(plan, "rank 1", stuck_at(dump, (str(tmp_path),)))
    assert hang["change"] == "line 35 of basic_main.py: [wrap] wrapped model in DistributedDataParallel"
    assert hang["summary"] == (f"at basic_main_ddp.py:{wrap} in main `model = DDP(`, waiting in __init__ "
                               f"(torch/nn/parallel/distributed.py:9), a line the converter wrote for {hang['change']}")
    assert hang["frames"][1:] == [f"basic_main_ddp.py:{wrap} in main `model = DDP(`"]
    assert plan.change_at(str(script), 1) is None  # the script's docstring: no change wrote it


NUMPY_ERROR = """Traceback (most recent call last):
  File "/work/train.py", line 3, in <module>
    labels = labels.astype(np.int)
                           ^^^^^^
  File "/site-packages/numpy/__init__.py", line 324, in __getattr__
    raise AttributeError(__former_attrs__[attr])
AttributeError: module 'numpy' has no attribute 'int'.
`np.int` was a deprecated alias for the builtin `int`. To avoid this error in existing code, use `int` by itself.
The aliases was originally deprecated in NumPy 1.20; for more details and guidance see the original release note at:
    https://numpy.org/devdocs/release/1.20.0-notes.html#deprecations
"""


def test_the_exception_line_is_the_one_naming_the_exception_not_the_end_of_its_message(tmp_path):
    assert exception_line(NUMPY_ERROR) == "AttributeError: module 'numpy' has no attribute 'int'."
    chained = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'a'\n\nDuring handling of the above " \
              "exception, another exception occurred:\n\n" + NUMPY_ERROR
    assert exception_line(chained) == "AttributeError: module 'numpy' has no attribute 'int'."
    (tmp_path / "error.txt").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n\n")
    assert exception_line_in(str(tmp_path / "error.txt")) == "ValueError: boom"
    assert exception_line("no traceback here\nlast words\n\n") == "last words"


def test_raise_location_is_the_innermost_frame_of_the_script_with_its_source(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("def step(x):\n    return x.reshape(8, -1)\nstep(None)\n")
    traceback = tmp_path / "error.txt"
    traceback.write_text(f'Traceback (most recent call last):\n  File "{script}", line 3, in <module>\n    step(None)\n'
                         f'  File "{script}", line 2, in step\n    return x.reshape(8, -1)\n           ^^^^^^^^^\n'
                         f'  File "/torch/nn/functional.py", line 9, in linear\nAttributeError: boom\n')
    assert raise_location(str(traceback), str(script)) == "train.py:2 `return x.reshape(8, -1)`"
    assert raise_location(str(traceback), "/elsewhere.py") is None


def test_report_marks_the_diverged_step_and_ends_with_the_verdict():
    ranks = [record([3.0, 2.0, 1.0], [STEPS[0], [1.0, 0.0], STEPS[2]])] * 2
    result = judge(make_plan(), record([3.0, 2.0, 1.0], STEPS), ranks)
    request = Request("train.py", "ddp", "t.py", 2, 3, "cpu", "per-gpu", 60.0, "fork", ())
    lines = render(request, result).splitlines()
    assert lines[-1].startswith("diverged at step 2 ")  # the cause follows: both ranks here saw the same data
    assert [line for line in lines if line.endswith("<- diverged")][0].split()[0] == "2"
    assert os.path.basename(request.against) in lines[0]


@pytest.fixture
def recorder(tmp_path):
    """A harness Recorder whose hooks are undone after the test."""
    import torch.nn.functional as F
    from torch.nn.modules.batchnorm import _BatchNorm

    from ddpify.verify.recorder import Recorder

    saved_functional = dict(vars(F))
    saved = [(torch.autograd, "backward"), (torch.amp.GradScaler, "scale"), (_BatchNorm, "forward"),
             (torch.autocast, "__enter__")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in saved]
    yield Recorder(str(tmp_path / "record.pt"), steps=100)
    vars(F).update(saved_functional)
    for owner, name, value in saved:
        setattr(owner, name, value)


def test_backward_records_the_loss_before_grad_scaler_scaling(recorder):
    from ddpify.verify.harness import capture_backward

    capture_backward(recorder)
    weight = torch.ones(3, requires_grad=True)
    loss = (weight * 2).sum()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(loss).backward()
    assert recorder.last_backward is loss
    assert weight.grad.tolist() == [2048.0] * 3


def test_dropout_is_the_identity_and_is_flagged(recorder):
    from ddpify.verify.harness import disable_dropout

    disable_dropout(recorder)
    x = torch.ones(4, 4)
    assert torch.equal(torch.nn.Dropout(0.5)(x), x)
    assert "dropout" in recorder.flags


def test_sum_reduction_is_flagged_only_while_autograd_records(recorder):
    from ddpify.verify.harness import watch_sum_reduction

    watch_sum_reduction(recorder)
    x, y = torch.ones(3), torch.zeros(3)
    with torch.no_grad():
        torch.nn.MSELoss(reduction="sum")(x, y)
    assert "sum_reduction" not in recorder.flags
    torch.nn.MSELoss(reduction="sum")(x, y)
    assert recorder.flags["sum_reduction"] == "mse_loss(reduction='sum')"


def test_enabled_half_precision_autocast_is_flagged(recorder):
    from ddpify.verify.harness import watch_reduced_precision

    watch_reduced_precision(recorder)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        pass
    assert "reduced_precision" not in recorder.flags
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pass
    assert recorder.flags["reduced_precision"] == "autocast('cpu', torch.bfloat16)"


def test_plain_batchnorm_in_training_mode_is_flagged(recorder):
    from ddpify.verify.harness import watch_plain_batchnorm

    watch_plain_batchnorm(recorder)
    norm = torch.nn.BatchNorm1d(2).eval()
    norm(torch.randn(4, 2))
    assert "plain_batchnorm" not in recorder.flags
    norm.train()(torch.randn(4, 2))
    assert recorder.flags["plain_batchnorm"] == "BatchNorm1d"


def batchnorm_pair():
    """Two identical BatchNorm1d layers (non-trivial affine parameters) and a batch of 8."""
    torch.manual_seed(0)
    norms = [torch.nn.BatchNorm1d(3, momentum=0.3) for _ in range(2)]
    with torch.no_grad():
        for norm in norms:
            norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
            norm.bias.copy_(torch.tensor([0.0, -1.0, 1.0]))
    return norms, torch.randn(8, 3) * 3 + 1


def test_reference_batchnorm_normalizes_each_ranks_part_and_keeps_rank_0s_running_statistics(recorder):
    (rank, norm), batch = batchnorm_pair()
    rank_1 = torch.nn.functional.batch_norm(batch[4:], None, None, rank.weight, rank.bias, True)
    expected = torch.cat([rank(batch[:4]), rank_1])
    rank_0_buffers = {name: value.clone() for name, value in rank.named_buffers()}  # rank 1's updates are not kept
    normalize_batchnorm_per_rank(2, True, recorder.flag)
    torch.testing.assert_close(norm(batch), expected, rtol=0, atol=1e-6)
    for name, value in norm.named_buffers():
        torch.testing.assert_close(value, rank_0_buffers[name], rtol=0, atol=1e-7)
    assert recorder.flags == {SPLIT_FLAG: "BatchNorm1d"}
    torch.testing.assert_close(norm.eval()(batch), rank.eval()(batch))  # eval: running statistics, whole batch


@pytest.mark.parametrize(("equal", "parts"), [(False, [3, 2]), (True, [5])])  # replicas: Tensor.chunk; ranks: equal parts
def test_reference_batchnorm_splits_as_the_candidate_does_or_flags_what_it_cannot_split(recorder, equal, parts):
    (norm, _), batch = batchnorm_pair()
    odd = batch[:5]
    expected = torch.cat([torch.nn.functional.batch_norm(part, None, None, norm.weight, norm.bias, True)
                          for part in odd.split(parts)])
    normalize_batchnorm_per_rank(2, equal, recorder.flag)
    torch.testing.assert_close(norm(odd), expected, rtol=0, atol=1e-6)
    unsplit = "BatchNorm1d normalized a batch of 5, which 2 ranks' equal parts cannot make up"
    assert recorder.flags.get(UNSPLIT_FLAG) == (unsplit if equal else None)


def test_noise_in_a_few_elements_that_training_moved_a_lot_is_equivalent_and_said_so():
    initial = torch.zeros(1000, dtype=torch.float64)
    reference = [torch.full((1000,), 0.1 * (k + 1), dtype=torch.float64) for k in range(3)]
    noisy = [p.clone() for p in reference]
    for p in noisy:
        p[7] += 1e-3  # one element an adaptive optimizer flipped: 3e-3 max relative, 3e-4 of the update
    base = Record([1.0, 1.0, 1.0], reference, {}, [], initial)
    result = judge(make_plan(), base, [Record([1.0, 1.0, 1.0], noisy, WRAPPED, [])] * 2)
    assert result["verdict"] == "equivalent", result["message"]
    assert "of the update" in result["message"]
    assert result["steps"][0]["update_rel_param"] == pytest.approx(1e-3 / (0.1 * 1000 ** 0.5))


def test_a_whole_update_that_differs_still_diverges():
    initial = torch.zeros(1000, dtype=torch.float64)
    reference = [torch.full((1000,), 0.1 * (k + 1), dtype=torch.float64) for k in range(3)]
    doubled = [2 * p for p in reference]  # e.g. gradients summed instead of averaged
    base = Record([1.0, 1.0, 1.0], reference, {}, [], initial)
    result = judge(make_plan(), base, [Record([1.0, 1.0, 1.0], doubled, WRAPPED, [])] * 2)
    assert (result["verdict"], result["diverged_at"]) == ("diverged", 1)
    assert "of the update" in result["message"]


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def diverged_result():
    return judge(make_plan(), record([3.0, 2.0, 1.0], STEPS), [record([3.0, 2.0, 1.0], [STEPS[0], [1.0, 0.0], STEPS[2]])] * 2)


def statistical_result():
    flags = {"plain_batchnorm": "BatchNorm2d"}
    ranks = [record([1.0, 1.01, 1.0], [[1.0, 2.0], [1.1, 2.15], [1.2, 2.2]], flags)] * 2
    return judge(make_plan(), record([1.0, 1.0, 1.0], STEPS, flags), ranks)


@pytest.mark.parametrize("make_result", [diverged_result, statistical_result])
def test_plot_replaces_the_file_with_a_whole_png_and_leaves_no_temporary(tmp_path, make_result):
    pytest.importorskip("matplotlib")
    from ddpify.verify.plot import write_plot

    path = tmp_path / "curves.png"
    path.write_text("an older plot")
    write_plot(make_result(), str(path), "verify train.py against t.py")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]


def test_the_verdict_names_the_tolerance_of_each_column_it_checked():
    assert diverged_result()["tolerances"] == {"rel_loss": 1e-5, "max_rel_param": 1e-5, "update_rel_param": 1e-2}
    assert statistical_result()["tolerances"] == {"rel_loss": 5e-2, "max_rel_param": None, "update_rel_param": None}


def invoke_verify(monkeypatch, *args, result=None):
    """`ddpify verify train.py --to ddp ARGS` in this process; the pair is not run (verify_pair returns `result`,
    or fails the test if called when `result` is None)."""
    from click.testing import CliRunner

    from ddpify.cli import cli

    def verify_pair(request):
        assert result is not None, "verify ran the scripts"
        return result

    monkeypatch.setattr("ddpify.commands.verify.verify_pair", verify_pair)
    script = os.path.join(os.path.dirname(__file__), "verify_cases", "train.py")
    return CliRunner().invoke(cli, ["verify", script, "--to", "ddp", *args])


def test_plot_without_matplotlib_is_a_one_line_error_before_anything_runs(monkeypatch, tmp_path):
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    outcome = invoke_verify(monkeypatch, "--plot", str(tmp_path / "curves.png"))
    assert outcome.exit_code == 2
    assert outcome.stderr == 'error: --plot draws with matplotlib, which is not installed: pip install "ddpify[plot]"\n'
    assert outcome.stdout == "" and list(tmp_path.iterdir()) == []


def test_plot_in_a_format_matplotlib_lacks_is_refused_before_anything_runs(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    outcome = invoke_verify(monkeypatch, "--plot", str(tmp_path / "curves.xyz"))
    assert outcome.exit_code == 2
    assert outcome.stderr.startswith("error: --plot cannot write .xyz files; use one of:")


def test_no_plot_is_written_for_a_pair_that_could_not_run(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    from ddpify.verify.result import error_result

    path = tmp_path / "curves.png"
    outcome = invoke_verify(monkeypatch, "--plot", str(path), result=error_result("rank 1 failed: boom"))
    assert outcome.exit_code == 2
    assert f"no plot written to {path}: no step was compared" in outcome.stderr
    assert not path.exists()


def test_a_conversion_left_unfinished_and_unchanged_says_why_verify_cannot_run():
    """dp's whole-graph refusal leaves graph_node_masks.py as it was (exit 3): verify names the reason."""
    from ddpify.verify.runner import CandidateUnavailable, Request, convert

    request = Request(str(FIXTURES / "graph_node_masks.py"), "dp", None, 1, 8, "cpu", "per-gpu", 60.0, "fork", ())
    with pytest.raises(CandidateUnavailable, match=r"left the script unchanged \(model is not wrapped in nn.DataParallel: "
                                                   r"`model\(features, adj\)` runs the forward on the whole data"):
        convert(request)
