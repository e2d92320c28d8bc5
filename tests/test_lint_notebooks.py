"""`ddpify lint` on notebooks: findings located by cell, JSON cell/line, fixes refused cleanly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.lint.engine import Options, lint_file

NOTEBOOKS = Path(__file__).parent.parent / "fixtures" / "notebooks"
DDP_NB = NOTEBOOKS / "ddp_resume.ipynb"  # torch.load without map_location in cell 5, line 2


def lint(*args: str):
    return CliRunner().invoke(cli, ["lint", "--no-progress", *map(str, args)])


def test_text_output_names_cell_and_line():
    result = lint(DDP_NB)
    assert result.exit_code == 1, result.output
    assert f"{DDP_NB}:cell 5:line 2: DDP001 " in result.stdout
    assert ' 2 | state = torch.load("checkpoint.pt")' in result.stdout


def test_json_has_cell_and_line_in_cell():
    result = lint("--output-format", "json", DDP_NB)
    (finding,) = json.loads(result.stdout)
    assert finding["code"] == "DDP001"
    assert (finding["cell"], finding["line"], finding["end_line"]) == (5, 2, 2)
    assert finding["script_line"] > finding["line"]  # the joined-script line is kept too


def test_github_and_sarif_use_joined_script_line():
    (finding,) = json.loads(lint("--output-format", "json", DDP_NB).stdout)
    github = lint("--output-format", "github", DDP_NB).stdout
    assert f"line={finding['script_line']}," in github
    sarif = json.loads(lint("--output-format", "sarif", DDP_NB).stdout)
    (result,) = sarif["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == finding["script_line"]


def test_directory_walk_includes_notebooks(tmp_path):
    shutil.copy(DDP_NB, tmp_path / "nb.ipynb")
    (tmp_path / "clean.py").write_text("import torch\n")
    result = lint(tmp_path)
    assert "nb.ipynb:cell 5:line 2: DDP001" in result.stdout
    assert "2 files scanned" in result.stderr


def test_fix_refused_and_notebook_untouched(tmp_path):
    nb = tmp_path / "nb.ipynb"
    shutil.copy(DDP_NB, nb)
    before = nb.read_bytes()
    for flags in (["--fix"], ["--fix", "--unsafe-fixes"], ["--diff"], ["--unsafe-fixes", "--diff"]):
        result = lint(*flags, nb)
        assert nb.read_bytes() == before
        notes = [line for line in result.stderr.splitlines() if "not supported for notebooks" in line]
        assert len(notes) == 1, result.stderr
        assert "Traceback" not in result.output
        assert result.exit_code != 2


def test_notebook_without_torch_is_skipped(tmp_path):
    nb = tmp_path / "plain.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "id": "c0", "metadata": {}, "outputs": [], "execution_count": None,
                                         "source": "print('hi')"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert lint_file(str(nb), Options()).skipped


def test_broken_notebook_is_an_error_not_a_crash(tmp_path):
    nb = tmp_path / "broken.ipynb"
    nb.write_text("{not json")
    result = lint(nb)
    assert result.exit_code == 2
    assert "broken.ipynb" in result.stderr and "Traceback" not in result.output


def test_magics_notebook_lints():
    report = lint_file(str(NOTEBOOKS / "magics.ipynb"), Options())
    assert not report.errors
    for d in report.diagnostics:
        assert d.location and d.location.startswith("cell ")
