"""Terminal output of `ddpify lint`: plain when piped / NO_COLOR / CI, colour when forced, summary."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.lint import terminal

DDP_NB = Path(__file__).parent.parent / "fixtures" / "notebooks" / "ddp_resume.ipynb"
ANSI = re.compile(r"\x1b\[")
SCRIPT = "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\nstate = torch.load('ckpt.pt')\n"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("NO_COLOR", "CI", "DDPIFY_FORCE_TERMINAL"):
        monkeypatch.delenv(name, raising=False)


def lint(*args):
    return CliRunner().invoke(cli, ["lint", *map(str, args)])


def test_piped_output_has_no_ansi(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    result = subprocess.run([sys.executable, "-m", "ddpify", "lint", str(tmp_path)], capture_output=True, text=True)
    assert "DDP001" in result.stdout
    assert not ANSI.search(result.stdout) and not ANSI.search(result.stderr)


def test_no_progress_accepted(tmp_path):
    for i in range(terminal.PROGRESS_MIN_FILES + 2):
        (tmp_path / f"s{i}.py").write_text(SCRIPT)
    result = lint("--no-progress", "-j", "1", tmp_path)
    assert result.exit_code == 1, result.output
    assert f"{terminal.PROGRESS_MIN_FILES + 2} files scanned" in result.stderr


def test_forced_terminal_colours_codes_and_paths(monkeypatch):
    monkeypatch.setenv("DDPIFY_FORCE_TERMINAL", "1")
    result = lint("--no-progress", DDP_NB)
    assert ANSI.search(result.stdout)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    assert f"{DDP_NB}:cell 5:line 2: DDP001 " in plain


def test_no_color_respected(monkeypatch):
    monkeypatch.setenv("DDPIFY_FORCE_TERMINAL", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    result = lint(DDP_NB)
    assert "DDP001" in result.stdout and not ANSI.search(result.output)


def test_ci_is_plain(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert not terminal.use_colour() and not terminal.use_progress(100, False)


def test_progress_needs_many_files_and_a_terminal(monkeypatch):
    monkeypatch.setenv("DDPIFY_FORCE_TERMINAL", "1")
    assert terminal.use_progress(terminal.PROGRESS_MIN_FILES + 1, False)
    assert not terminal.use_progress(terminal.PROGRESS_MIN_FILES, False)
    assert not terminal.use_progress(100, True)


def test_forced_progress_bar_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPIFY_FORCE_TERMINAL", "1")
    for i in range(terminal.PROGRESS_MIN_FILES + 2):
        (tmp_path / f"s{i}.py").write_text(SCRIPT)
    result = lint("-j", "1", tmp_path)
    assert result.exit_code == 1, result.output
    assert "files scanned" in result.stderr


def test_summary_line(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    result = lint(tmp_path)
    assert re.search(r"ddpify: 1 file scanned, 1 finding \(DDP001: 1\), .* in \d+\.\d\ds", result.stderr), result.stderr
