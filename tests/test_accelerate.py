"""`ddpify convert --to accelerate`: the shape of the output on small inputs, and real runs.

Every top-level fixture (the set `--to ddp` converts) is converted with --to accelerate; each
complete conversion runs under torchrun on 2 CPU ranks (gloo; Accelerator() takes torchrun's
environment) through the tests' fork server, to its end, with a timeout (bench/run_converted.py's
launch, as tests/test_converted_runs.py makes them). A few are verified equivalent to the original.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import FIXTURES_DIR  # noqa: E402
from test_converted_runs import bench, launcher  # noqa: E402

from ddpify.codemods.pipeline import Status  # noqa: E402
from ddpify.convert import convert_source  # noqa: E402

TOP_LEVEL = [entry for entry in bench.entries() if "/" not in entry.name]


def convert(code: str):
    return convert_source(textwrap.dedent(code), "accelerate", path="train.py")


# ===== execution ===============================================================================
def test_top_level_fixtures_are_the_ddp_set():
    assert sorted(e.script for e in TOP_LEVEL) == sorted(p for p in FIXTURES_DIR.glob("*.py"))


@pytest.mark.parametrize("entry", TOP_LEVEL, ids=[e.name for e in TOP_LEVEL])
def test_converted_fixture_runs_to_the_end_on_two_ranks(entry, tmp_path):
    outcome = bench.run_one(entry, "accelerate", tmp_path, launcher(entry.name, "accelerate"))
    if outcome.status == "incomplete":
        pytest.skip(f"the conversion is incomplete: {outcome.detail}")
    assert outcome.status == "finished", bench.line(outcome)
