"""A conversion analyses its file once per pipeline stage plus once for the lint of its output (whose
parse the width pass shares): the
project layer's analysis is the first stage's (ddpify.project_conversion hands it on), and the
input is syntax-checked once. The rank-0 duties are planned ahead of the first stage's edits, on
the input, where those edits change nothing its plan reads (ddpify.codemods.pipeline); the last
tests here show shapes where they do, so rank 0 waits for a second stage, and one where its edits
and log-loss's land on one print in one pass."""

from __future__ import annotations

import ast
import builtins
import textwrap
from pathlib import Path

import pytest

from ddpify.anatomy import Anatomy, analyze
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.module_access import DDPModuleAccess
from ddpify.codemods.ddp.batch_draws import BatchesOfEachRank
from ddpify.codemods.ddp.noise import NoiseOfEachRank
from ddpify.codemods.ddp.rank_zero import RankZeroDuties
from ddpify.codemods.ddp.sum_loss import SumLossScaling
from ddpify.codemods.options import Options
from ddpify.codemods.pipeline import ConversionResult, Status
from ddpify.convert import convert_source
from ddpify.edits.engine import Edits
from ddpify.edits.statements import parse_statements
from ddpify.project_conversion import plan_conversion
from test_real_shapes import guarded_by_rank_zero
from test_wraps_made import HEAD

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture
def counts(monkeypatch):
    """How many analyses (Anatomy objects made) and full compiles (syntax checks) happen: (file, text) of each."""
    made = {"analyses": 0, "compiles": [], "parses": []}
    analyse, compile_ = Anatomy.__init__, builtins.compile

    def counted_analysis(self, *args, **kwargs):
        made["analyses"] += 1
        analyse(self, *args, **kwargs)

    def counted_compile(source, filename, mode, flags=0, *args, **kwargs):
        if mode == "exec":
            made["parses" if flags & ast.PyCF_ONLY_AST else "compiles"].append((str(filename), source))
        return compile_(source, filename, mode, flags, *args, **kwargs)

    monkeypatch.setattr(Anatomy, "__init__", counted_analysis)
    monkeypatch.setattr(builtins, "compile", counted_compile)
    return made


def _convert(path: Path, target: str):
    plan = plan_conversion([path], [path], target, {}, "write", None)
    return plan.jobs[path].convert()


@pytest.mark.parametrize(("fixture", "target", "analyses"), [
    # one stage: the project's analysis plans it, the output's analysis lints it (rank 0 planned
    # ahead of the wrap or the shard and of log-loss, whose edits change nothing it reads here)
    ("basic_main.py", "dp", 2),
    ("basic_main.py", "ddp", 2),
    ("basic_main.py", "fsdp", 2),
])
def test_a_one_file_convert_analyses_once_per_stage_and_once_for_lint(counts, fixture, target, analyses):
    path = FIXTURES / fixture
    result = _convert(path, target)
    assert result.changed
    assert counts["analyses"] == analyses
    assert counts["compiles"].count((str(path), path.read_text())) == 1  # the input's (the output is checked once too)


def test_the_output_is_parsed_once_for_its_lint_and_the_width_pass(counts):
    """The lint of the output and the width pass read one parse of it (they judge the same statements)."""
    path = FIXTURES / "basic_main.py"
    result = _convert(path, "ddp")
    outputs = [source for _, source in counts["parses"] if len(source) > len(path.read_text()) and source.startswith('"""Minimal')]
    assert len(outputs) == 1  # the output as the last stage left it
    assert result.output not in outputs  # laid out again after that parse: some converted lines were too wide


# A print of a local evaluation: before the first stage, `evaluate` neither reduces over ranks nor is
# handed a DDP wrapper; after it, it does both.
PRINTED_EVALUATION = """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def evaluate(model, loader):
        correct = 0
        with torch.no_grad():
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum().item()
        return correct / len(loader.dataset)


    def main():
        data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        train_loader = DataLoader(data, batch_size=8, shuffle=True)
        val_loader = DataLoader(data, batch_size=8)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for x, y in train_loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            print(f"epoch {epoch} acc {evaluate(model, val_loader):.3f}")


    if __name__ == "__main__":
        main()
    """


def planned_both_ways(counts, monkeypatch, text: str, transform: type) -> tuple[ConversionResult, int, ConversionResult, int]:
    """`text` (dedented) converted --to ddp with `transform` planned ahead of the edits it reads, then
    waiting for them: each result, with the analyses it took."""
    counts["analyses"] = 0
    ahead = convert_source(textwrap.dedent(text), "ddp")
    ahead_analyses, counts["analyses"] = counts["analyses"], 0
    monkeypatch.setattr(transform, "PLANS_AHEAD_OF", ())
    return ahead, ahead_analyses, convert_source(textwrap.dedent(text), "ddp"), counts["analyses"]


def reported(result: ConversionResult) -> tuple:
    """What a conversion gives the user: its code and its changes, advice and missing items."""
    return result.output, result.changes, result.advice, result.missing


def _analyses_of(counts, text: str, target: str, **options) -> int:
    counts["analyses"] = 0
    convert_source(textwrap.dedent(text), target, **options)
    return counts["analyses"]


def test_a_printed_evaluation_waits_for_the_edits_it_reads(counts):
    """`evaluate(model, val_loader)` in a print reads a model (the wrap makes it a wrapper) and a
    function the evaluation sharding edits: rank 0 is planned on the code they produce."""
    assert _analyses_of(counts, PRINTED_EVALUATION, "ddp") == 3


# Output next to a loss print that log-loss rewrites in place: rank 0 guards both in the same pass,
# each under its own `if` (the mean over ranks, computed between them, runs on every rank).
NEIGHBOURING_PRINTS = """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for step, (x, y) in enumerate(loader):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                print("step", step)
                print(f"loss {loss.item():.4f}")
                print("done with", step)


    if __name__ == "__main__":
        main()
    """


# An epoch's training printed: rank 0 hoists it into a fresh variable every rank computes, then prints.
PRINTED_TRAINING = """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def train_epoch(model, loader, opt):
        total = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        return total


    def main():
        data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            print(f"epoch {epoch} loss {train_epoch(model, loader, opt):.3f}")


    if __name__ == "__main__":
        main()
    """


@pytest.mark.parametrize(("text", "every_rank", "rank_zero"), [
    (NEIGHBOURING_PRINTS, "loss_avg = mean_over_ranks(loss)", 'print(f"loss {loss_avg.item():.4f}")'),
    (PRINTED_TRAINING, "train_epoch_result = train_epoch(model, loader, opt)", 'print(f"epoch {epoch} loss {train_epoch_result:.3f}")'),
], ids=["prints beside a loss print", "a printed epoch hoisted"])
def test_rank_zero_planned_ahead_makes_the_code_and_report_of_planning_it_after(counts, monkeypatch, text, every_rank, rank_zero):
    """In the first stage: its guards land in the same pass as log-loss's rewrite of a print beside
    them, each under its own `if`; a value it hoists goes into a name fresh in the code the pending
    edits make too (Transform.fresh_name)."""
    planned_ahead, ahead, waited, waiting = planned_both_ways(counts, monkeypatch, text, RankZeroDuties)
    assert (ahead, waiting) == (2, 3)
    assert reported(planned_ahead) == reported(waited) and planned_ahead.status is Status.CONVERTED
    assert not guarded_by_rank_zero(planned_ahead.output, every_rank)
    assert guarded_by_rank_zero(planned_ahead.output, rank_zero)


def test_the_rank_zero_plan_sees_the_reductions_the_evaluation_sharding_adds():
    """Sharded, `evaluate` all-reduces its sums: every rank computes it, rank 0 alone prints (planned
    on the input, the print would keep the call under `if RANK == 0:` and hang the other ranks)."""
    result = convert_source(textwrap.dedent(PRINTED_EVALUATION), "ddp")
    assert result.status is Status.CONVERTED, result.missing
    assert "evaluate_result = evaluate(model, val_loader)" in result.output
    assert not guarded_by_rank_zero(result.output, "evaluate_result = evaluate(")
    assert guarded_by_rank_zero(result.output, 'print(f"epoch {epoch} acc {evaluate_result:.3f}")')


def test_the_rank_zero_plan_sees_the_wrapper_the_wrap_makes():
    """Evaluated whole on rank 0 only, `evaluate` gets the module inside the wrapper (planned on the
    input, where `model` is no wrapper yet, it would get the wrapper, whose forward syncs every rank)."""
    result = convert_source(textwrap.dedent(PRINTED_EVALUATION), "ddp", eval="whole")
    assert result.status is Status.CONVERTED, result.missing
    assert guarded_by_rank_zero(result.output, "evaluate(model.module, val_loader)")


# A model's own attribute read and its state_dict saved after training: `.module` access and rank 0
# (which guards the save) read the wrapper the wrap makes.
WRAPPER_READS = HEAD + textwrap.dedent("""\
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        print("classes", model.classes)
        torch.save(model.state_dict(), "model.pt")


    if __name__ == "__main__":
        main()
    """)


def test_the_plans_that_read_the_wrapper_see_the_wrap_made_in_the_same_stage(counts, monkeypatch):
    """`.module` access and rank 0 plan on the anatomy that shows the wrap made: one stage, and the
    code and report of planning them on the wrap's output (a second stage)."""
    seen_made = convert_source(textwrap.dedent(WRAPPER_READS), "ddp")
    assert counts["analyses"] == 2
    for transform in (DDPModuleAccess, RankZeroDuties):
        monkeypatch.setattr(transform, "SEES_WRAPS_MADE", False)
    assert _analyses_of(counts, WRAPPER_READS, "ddp") == 3
    waited = convert_source(textwrap.dedent(WRAPPER_READS), "ddp")
    assert seen_made.output == waited.output
    assert seen_made.changes == waited.changes and seen_made.status is Status.CONVERTED
    assert guarded_by_rank_zero(seen_made.output, 'torch.save(model.module.state_dict(), "model.pt")')
    assert guarded_by_rank_zero(seen_made.output, 'print("classes", model.module.classes)')


def test_a_fresh_name_is_fresh_in_the_code_the_pending_edits_make():
    """Taken: the names of the statements the pending edits insert and those they chose fresh."""
    pending = Edits()
    pending.before[(1, 0)] = parse_statements("evaluate_result = 0\n")
    pending.fresh.add("loss_avg")
    transform = Transform(None, analyze("x = 1\n"), Options(), pending)
    assert transform.fresh_name("evaluate_result", set()) == "evaluate_result1"
    assert transform.fresh_name("loss_avg", set()) == "loss_avg1"
    assert transform.fresh_name("x", set()) == "x1"
    assert transform.edits.fresh == {"evaluate_result1", "loss_avg1", "x1"}


# Trained on whole tensors: the ranks share the rows of each loss (ddp/rows.py), whose edits the loss
# scaling reads (a shared loss is weighted there, sums included).
ROWS_SHARED = ["full_batch_regression.py", "graph_node_masks.py", "hand_sliced_batches.py", "real/fullbatch_regression.py",
               "projects/trainer_package/trainer/core.py", "projects/work_in_fstrings/engine.py",
               "real/rebuilt_loader_project/engine.py", "real/trainer_project/trainer.py"]

SUMMED_WHOLE_BATCH = """\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    y = 3 * x + 1
    model = nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(20):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y, reduction="sum")
        loss.backward()
        opt.step()
    """


@pytest.mark.parametrize("fixture", ROWS_SHARED)
def test_the_loss_scaling_that_finds_nothing_holds_ahead_of_the_rows_each_rank_shares(counts, monkeypatch, fixture):
    """Planned ahead of rows' edits, a loss scaling that finds nothing to scale joins their stage; the
    same code and report as planned on rows' output."""
    text = (FIXTURES / fixture).read_text()
    planned_ahead, ahead, waited, waiting = planned_both_ways(counts, monkeypatch, text, SumLossScaling)
    assert (ahead, waiting) == (2, 3)
    assert any(change.transform == "rows" for change in planned_ahead.changes)
    assert reported(planned_ahead) == reported(waited)


def test_a_summed_loss_the_ranks_share_is_scaled_by_rows_alone(counts):
    """Ahead of rows, the scaling finds the summed loss: it waits for rows, which weighs the sum by
    WORLD_SIZE itself, and then finds nothing more to scale."""
    result = convert_source(textwrap.dedent(SUMMED_WHOLE_BATCH), "ddp")
    assert counts["analyses"] == 3
    assert result.status is Status.CONVERTED, result.missing
    assert any(change.transform == "rows" and "its sum by WORLD_SIZE" in change.message for change in result.changes)
    assert "    loss.backward()" in result.output and "(loss * WORLD_SIZE)" not in result.output


@pytest.mark.parametrize(("fixture", "transform"), [
    ("real/pair_sampling_unseeded_random.py", NoiseOfEachRank),
    ("real/dcgan_toy.py", NoiseOfEachRank), ("real/char_lm_nanogpt.py", BatchesOfEachRank),
])
def test_the_reseed_after_the_wrap_is_planned_where_the_wraps_are_seen_made(counts, monkeypatch, fixture, transform):
    """Each rank's own noise or batches start after the last wrap: planned ahead of it, on the anatomy
    that shows the wraps made, in a stage fewer, with the code and report of planning on its output."""
    planned_ahead, ahead, waited, waiting = planned_both_ways(counts, monkeypatch, (FIXTURES / fixture).read_text(), transform)
    assert waiting == ahead + 1
    assert any(change.transform == transform.NAME for change in planned_ahead.changes)
    assert reported(planned_ahead) == reported(waited)
