"""An entry script below the package it trains with (fixtures/repo_layout/): imports found beyond the
entry's directory, through a `sys.path` edit, the repository root or an in-place install; and an
entry whose imports are found nowhere is "incomplete: training may live in ...", never "nothing to do"."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ddpify.anatomy.project import Project

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import failure_report, run_ddpify, run_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "fixtures" / "repo_layout"
ENTRY = Path("projects") / "demo" / "train.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def copy_layout(tmp_path: Path, without_path_edit: bool = False) -> Path:
    """The fixture in tmp_path/repo (its entry without the sys.path edit, if asked)."""
    repo = tmp_path / "repo"
    shutil.copytree(LAYOUT, repo, ignore=shutil.ignore_patterns("__pycache__"))
    if without_path_edit:
        entry = repo / ENTRY
        entry.write_text("\n".join(line for line in entry.read_text().splitlines() if "sys.path" not in line) + "\n")
    return repo


def project_files(repo: Path) -> list[str]:
    project = Project([repo / ENTRY], lambda path: Path(path).read_text())
    return sorted(Path(os.path.relpath(m.path, repo)).as_posix() for m in project.files())


def test_a_sys_path_edit_brings_the_package_into_the_project(tmp_path):
    repo = copy_layout(tmp_path)
    assert project_files(repo) == ["mypkg/__init__.py", "mypkg/model.py", "mypkg/trainer.py", "projects/demo/train.py"]


def test_the_repository_root_is_searched_when_the_entry_edits_no_path(tmp_path):
    repo = copy_layout(tmp_path, without_path_edit=True)
    (repo / "setup.py").write_text("from setuptools import setup\nsetup(name='mypkg')\n")
    assert "mypkg/trainer.py" in project_files(repo)


def test_imports_found_nowhere_make_the_conversion_incomplete_not_nothing_to_do(tmp_path):
    repo = copy_layout(tmp_path, without_path_edit=True)
    proc = run_ddpify(["convert", str(repo / ENTRY), "--to", "ddp"], tmp_path)
    assert proc.returncode == 3, failure_report(proc)
    assert "it may live in mypkg.model" in proc.stdout + proc.stderr
    assert "nothing to do" not in proc.stdout + proc.stderr


def test_an_in_place_install_on_the_path_is_followed(tmp_path):
    repo = copy_layout(tmp_path, without_path_edit=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(repo)])}  # a real process: a fork keeps the server's path
    proc = subprocess.run([sys.executable, "-m", "ddpify", "convert", str(repo / ENTRY), "--to", "ddp", "--diff"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mypkg/trainer.py" in proc.stdout and "DistributedSampler" in proc.stdout


def test_the_converted_layout_runs_under_torchrun_and_verifies(tmp_path):
    repo = copy_layout(tmp_path)
    proc = run_ddpify(["convert", str(ENTRY), "--to", "ddp"], repo / ENTRY.parent.parent.parent)
    assert proc.returncode == 0, failure_report(proc)
    mirror = tmp_path / "repo_ddp"
    assert (mirror / "mypkg" / "trainer.py").read_text() != (repo / "mypkg" / "trainer.py").read_text()
    run = run_script([*TORCHRUN, "train.py"], mirror / ENTRY.parent, {"OMP_NUM_THREADS": "1"}, timeout=180)
    assert run.returncode == 0, failure_report(run)
    assert run.stdout.count("done") == 1, failure_report(run)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = run_ddpify(["verify", str(ENTRY), "--to", "ddp", "--json", "--timeout", "200"], repo, env, 300)
    assert json.loads(proc.stdout)["verdict"] == "equivalent", failure_report(proc)
