"""`convert --to dp` on the DataParallel fixture projects (fixtures/dp/<name>/: a `model.py` that defines
the model, a `train.py` that builds it in its `__main__` block), as public code lays them out.

Each is either converted, and then runs like the original and `ddpify verify --to dp` finds it
equivalent (on CPU DataParallel just calls the module; verify runs it as simulated replicas and
calls a candidate that never ran an nn.DataParallel forward "not converted", so "equivalent"
proves training went through the wrapper), or refused (exit 3) with a missing item that names the
line and the reason; the refused conversion, written anyway with --partial, really fails or never
runs through DataParallel under the same simulation.

Snapshots of the converted entries: fixtures/expected/dp/projects/<name>/ (regenerate with
DDPIFY_UPDATE_SNAPSHOTS=1 and read the diff).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from ddpify.project_conversion import convert_entry

try:
    from helpers import FIXTURES_DIR, failure_report, python_argv, run_ddpify, run_script
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import FIXTURES_DIR, failure_report, python_argv, run_ddpify, run_script

PROJECTS = FIXTURES_DIR / "dp"
EXPECTED = FIXTURES_DIR / "expected" / "dp" / "projects"
ENTRY = "train.py"
CONVERTED = ("diffusion_loss", "main_block", "thin_forward_method")
# what each refusal says, on which line of train.py, and what verify finds in the conversion written anyway
REFUSED = {
    "compute_loss_method": (18, "the training step calls model.compute_loss(...), not forward", "not_converted"),
    "packed_output": (22, "DataParallel cannot gather what `model(...)` returns", "error"),
    "rnn_hidden_state": (21, "`h` is the hidden state of self.rnn, shaped (layers, batch, hidden)", "error"),
}
ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(FIXTURES_DIR.parent), os.environ.get("PYTHONPATH")]))}


def test_every_project_is_listed():
    assert sorted(p.name for p in PROJECTS.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted([*CONVERTED, *REFUSED])


def converted(name: str) -> dict[str, str]:
    """The files the conversion changes, by path relative to the project."""
    conversion = convert_entry(PROJECTS / name / ENTRY, "dp", {})
    return {job.path.relative_to(PROJECTS / name).as_posix(): job.result.output for job in conversion.jobs if job.changed}


def expected(name: str) -> dict[str, str]:
    return {p.relative_to(EXPECTED / name).as_posix(): p.read_text() for p in sorted((EXPECTED / name).rglob("*.py"))}


@pytest.mark.parametrize("name", CONVERTED)
def test_snapshot(name: str):
    changed = converted(name)
    if os.environ.get("DDPIFY_UPDATE_SNAPSHOTS") == "1":
        shutil.rmtree(EXPECTED / name, ignore_errors=True)
        for path, text in changed.items():
            (EXPECTED / name / path).parent.mkdir(parents=True, exist_ok=True)
            (EXPECTED / name / path).write_text(text)
    assert changed == expected(name)
    assert set(changed) == {ENTRY}, "model.py trains nothing: only the entry changes"


@pytest.mark.parametrize("name", CONVERTED)
def test_converting_again_changes_nothing(name: str, tmp_path: Path):
    project = copy_converted(name, tmp_path)
    assert not [job.path for job in convert_entry(project / ENTRY, "dp", {}).jobs if job.changed]


def copy_converted(name: str, tmp_path: Path) -> Path:
    project = tmp_path / name
    shutil.copytree(PROJECTS / name, project, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in expected(name).items():
        (project / path).write_text(text)
    return project


@pytest.mark.parametrize("name", CONVERTED)
def test_the_wrap_comes_before_training_in_the_main_block(name: str):
    lines = expected(name)[ENTRY].splitlines()
    wrap = next(i for i, line in enumerate(lines) if "nn.DataParallel(model)" in line)
    assert lines[wrap].startswith("    ") and wrap < next(i for i, line in enumerate(lines) if "for epoch" in line)


@pytest.mark.parametrize("name", CONVERTED)
def test_converted_project_runs_like_the_original_and_lints_clean(name: str, tmp_path: Path):
    project = copy_converted(name, tmp_path)
    original = run_script(python_argv(PROJECTS / name / ENTRY), PROJECTS / name, timeout=120)
    result = run_script(python_argv(project / ENTRY), project, timeout=120)
    assert result.returncode == 0, failure_report(result)
    assert result.stdout == original.stdout
    lint = run_ddpify(["lint", ENTRY], project, ENV, 120)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("name", CONVERTED)
def test_verify_trains_through_dataparallel_and_finds_it_equivalent(name: str):
    # run from the projects' folder (above the project): each side mirrors it, not the whole repository
    proc = run_ddpify(["verify", str(PROJECTS / name / ENTRY), "--to", "dp", "--json", "--timeout", "200"], PROJECTS, ENV, 300)
    result = json.loads(proc.stdout)
    assert (proc.returncode, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_with_the_line_and_the_reason(name: str, tmp_path: Path):
    line, reason, _ = REFUSED[name]
    proc = run_ddpify(["convert", str(PROJECTS / name / ENTRY), "--to", "dp", "-o", str(tmp_path / "out")], FIXTURES_DIR.parent, ENV, 120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    missing = [text for text in (proc.stdout + proc.stderr).splitlines() if ": missing: " in text]
    assert len(missing) == 1 and missing[0].startswith(f"{PROJECTS / name / ENTRY}:{line}: missing: ") and reason in missing[0], missing
    assert not (tmp_path / "out").exists(), "nothing is written for an incomplete conversion"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_refused_conversion_would_not_train_on_several_gpus(name: str, tmp_path: Path):
    """What the conversion would have written, run as DataParallel on two simulated GPUs: it fails
    ("error"), or verify finds that no nn.DataParallel forward ran ("not_converted")."""
    project = tmp_path / name
    shutil.copytree(PROJECTS / name, project, ignore=shutil.ignore_patterns("__pycache__"))
    entry = next(job for job in convert_entry(project / ENTRY, "dp", {}).jobs if job.entry)
    (project / "partial.py").write_text(entry.result.output)
    proc = run_ddpify(["verify", ENTRY, "--to", "dp", "--against", "partial.py", "--json", "--timeout", "200"], project, ENV, 300)
    assert json.loads(proc.stdout)["verdict"] == REFUSED[name][2], proc.stdout
