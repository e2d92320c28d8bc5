"""The real-shaped corpus (fixtures/real/): every entry converts completely or says it did not.

Issue 10's invariant for `ddpify convert --to ddp`: each entry either converts completely (a
DDP wrap and sharded data), and then runs under torchrun with 2 ranks with its log printed once,
or reports an incomplete conversion with a non-zero exit. Never exit 0 on a half-done conversion.
Entries that break it today are strict xfails with the reason. bench/real_corpus.py measures the
rest (lint, verify, --to dp); this test reuses its checks and converts in-process. The torchrun
half starts one torchrun per completely converted entry (seconds each); `-k "not torchrun"` runs
only the conversion half.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli

BENCH = Path(__file__).resolve().parents[1] / "bench" / "real_corpus.py"
_spec = importlib.util.spec_from_file_location("real_corpus", BENCH)
corpus = sys.modules.setdefault("real_corpus", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(corpus)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_script  # noqa: E402


def run_as_test(argv: list, cwd: Path, timeout: float):
    """The bench's runs, through the tests' launcher (python and torchrun runs are forked)."""
    return run_script(argv, cwd, corpus.environment(), timeout)


corpus.run = run_as_test

# Entries whose conversion today is neither complete nor an honest "incomplete" exit: {name: why}.
NOT_HONEST_YET: dict[str, str] = {}  # every entry today ends converted or exits 3 naming what is missing
# Complete conversions that do not yet run under torchrun with 2 ranks: {name: why}.
TORCHRUN_FAILURES: dict[str, str] = {}  # every complete conversion runs under torchrun


def invoke_in_process(args: list, cwd: Path) -> tuple:
    """`ddpify ARGS` run by click in this process, in cwd: (exit code, output)."""
    with contextlib.chdir(cwd):
        result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output


class Conversions:
    """Each entry converted once (to DDP, in place, in a copy of its own)."""

    def __init__(self, root: Path):
        self.root = root
        self.done: dict = {}

    def of(self, entry) -> tuple:
        if entry.name not in self.done:
            folder = entry.copy_to(self.root / entry.name)
            self.done[entry.name] = (corpus.convert(entry, folder, "ddp", invoke_in_process), folder)
        return self.done[entry.name]


@pytest.fixture(scope="module")
def conversions(tmp_path_factory) -> Conversions:
    return Conversions(tmp_path_factory.mktemp("real_corpus"))


def entry_params(known: dict) -> list:
    return [pytest.param(entry, id=entry.name,
                         marks=[pytest.mark.xfail(reason=known[entry.name], strict=True)] if entry.name in known else [])
            for entry in corpus.entries()]


def test_the_corpus_has_at_least_30_entries():
    assert len(corpus.entries()) >= 30, [e.name for e in corpus.entries()]


def test_known_failures_name_real_entries():
    assert set(NOT_HONEST_YET) | set(TORCHRUN_FAILURES) <= {e.name for e in corpus.entries()}


def test_a_silent_half_conversion_is_told_apart_from_an_honest_one():
    before = {"train.py": "model = Net()\n"}
    wrapped_only = {"train.py": "model = DDP(Net())\n"}
    complete = {"train.py": "model = DDP(Net())\nsampler = DistributedSampler(ds)\n"}
    assert corpus.conversion_status(0, before, wrapped_only, "ddp") == ("incomplete, exit 0", ["train.py"])
    assert corpus.conversion_status(0, before, complete, "ddp")[0] == "converted"
    assert corpus.conversion_status(corpus.EXIT_INCOMPLETE, before, before, "ddp")[0] == "incomplete"
    assert corpus.conversion_status(0, before, before, "ddp")[0] == "nothing"


@pytest.mark.parametrize("entry", entry_params(NOT_HONEST_YET))
def test_converts_completely_or_reports_incomplete(entry, conversions):
    conversion, _ = conversions.of(entry)
    assert conversion.status == "converted" or (conversion.status == "incomplete" and conversion.exit_code != 0), \
        f"{entry.name}: {conversion.status} (exit {conversion.exit_code})\n{conversion.report}"


@pytest.mark.parametrize("entry", entry_params(TORCHRUN_FAILURES))
def test_complete_conversion_runs_under_torchrun_and_logs_once(entry, conversions, tmp_path):
    conversion, folder = conversions.of(entry)
    if conversion.status != "converted":
        pytest.skip(f"not converted completely ({conversion.status}): nothing to run")
    succeeded, outputs, report = corpus.torchrun(folder, entry.script, tmp_path / "logs")
    assert succeeded, f"{entry.name} under torchrun:\n{report}"
    assert corpus.logs_once(outputs), f"{entry.name}: rank stdouts {outputs}"
