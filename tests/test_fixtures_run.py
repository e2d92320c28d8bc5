"""Every fixture script in fixtures/ must run as-is on CPU.

The fixtures are the *inputs* of the converter, so they have to be valid
single-GPU training scripts first: exit 0 from an arbitrary working directory
and log at least one loss line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    from helpers import FIXTURES_DIR, failure_report, python_argv, run_script
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import FIXTURES_DIR, failure_report, python_argv, run_script

# top-level files only: subfolders of fixtures/ hold expected outputs etc.
FIXTURES = sorted(p for p in FIXTURES_DIR.glob("*.py") if p.is_file())


def test_there_are_fixtures():
    assert len(FIXTURES) >= 20, [p.name for p in FIXTURES]


@pytest.mark.parametrize("script", FIXTURES, ids=[p.name for p in FIXTURES])
def test_fixture_runs(script: Path, tmp_path: Path):
    before = sorted(p.name for p in FIXTURES_DIR.iterdir())
    result = run_script(python_argv(script), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, failure_report(result)
    lines = result.stdout.splitlines()
    assert any("loss" in line for line in lines), failure_report(result)
    # files the script writes must land in its cwd, never next to the script
    assert sorted(p.name for p in FIXTURES_DIR.iterdir()) == before
