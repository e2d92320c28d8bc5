"""Issue 14, reliability round two: interrupts, odd paths and files, config mistakes, teardown."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner
from test_robustness import BASIC, ROOT, TIMEOUT, ddpify

from ddpify.cli import SIGINT_EXIT, cli


ARGUMENTS = {"convert": ["--to", "ddp", "train.py"], "verify": ["--to", "ddp", "train.py"], "rules": [], "server": [], "mcp": []}


@pytest.mark.parametrize("name", cli.list_commands(click.Context(cli)))
def test_ctrl_c_exits_130_in_every_command(name, monkeypatch, tmp_path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.get_command(click.Context(cli), name), "callback", interrupted)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\n")
    result = CliRunner().invoke(cli, [name, *ARGUMENTS.get(name, ["train.py"])])
    assert result.exit_code == SIGINT_EXIT == 130, result.output
    assert "Interrupted." in result.output


def test_an_empty_output_name_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_bytes(BASIC)
    result = CliRunner().invoke(cli, ["convert", "--to", "ddp", "train.py", "-o", ""])
    assert result.exit_code == 2
    assert "-o/--output needs a file name" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.parametrize("table, message", [
    ("[tool.ddpify]\nselct = ['DDP']\n", "unknown key 'selct' in [tool.ddpify] (did you mean 'select'?)"),
    ("[tool.ddpify]\ncolour = true\n", "unknown key 'colour' in [tool.ddpify] (known keys: select,"),
])
def test_unknown_config_keys_are_named_in_one_line(tmp_path, monkeypatch, table, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(table)
    (tmp_path / "train.py").write_bytes(BASIC)
    result = CliRunner().invoke(cli, ["lint", "train.py"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [result.output.strip()]
    assert f"pyproject.toml: {message}" in result.output


def test_notebooks_without_cell_ids_convert_without_nbformat_warnings(tmp_path):
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": BASIC.decode()}]}
    (tmp_path / "old.ipynb").write_text(json.dumps(notebook))
    for args in (["lint", "old.ipynb"], ["convert", "--to", "dp", "--in-place", "old.ipynb"], ["explain", "old.ipynb"]):
        result = ddpify(*args, cwd=tmp_path)
        assert result.returncode in (0, 1), result.stderr
        assert "Warning" not in result.stderr and "nbformat" not in result.stderr, result.stderr


def _without_read_override() -> list[str]:
    """A command prefix under which chmod 000 really denies reading: root loses CAP_DAC_OVERRIDE."""
    if os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search"
    return [shutil.which("setpriv") or "setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]


@pytest.mark.parametrize("command, files, processed", [
    (["lint"], ["secret.py", "good.py"], "2 files scanned"),
    (["convert", "--to", "ddp", "--check"], ["secret.py", "good.py"], "would convert good.py"),
    (["explain"], ["secret.py"], ""),
])
def test_an_unreadable_file_named_on_the_command_line_is_one_line_and_the_rest_still_runs(
        tmp_path, command, files, processed):
    (tmp_path / "secret.py").write_bytes(BASIC)
    (tmp_path / "secret.py").chmod(0)
    (tmp_path / "good.py").write_bytes(BASIC)
    prefix = _without_read_override()
    if prefix and subprocess.run([*prefix, "cat", "secret.py"], cwd=tmp_path, capture_output=True).returncode == 0:
        pytest.skip("cannot drop the capability that lets root read a chmod 000 file")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([*prefix, sys.executable, "-m", "ddpify", *command, *files], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 2, result.stderr
    assert [line for line in result.stderr.splitlines() if "secret.py" in line] == [
        line for line in result.stderr.splitlines() if line.endswith("secret.py: permission denied")], result.stderr
    assert "secret.py: permission denied" in result.stdout + result.stderr
    assert "Usage:" not in result.stderr
    assert processed in result.stdout + result.stderr


FIXABLE = "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\nstate = torch.load('a')\n"


@pytest.mark.parametrize("command, content", [
    (["lint", "--select", "DDP001", "--fix", "--unsafe-fixes"], FIXABLE),
    (["convert", "--to", "ddp", "--in-place"], BASIC.decode()),
], ids=["lint-fix", "convert-in-place"])
def test_writes_never_follow_a_symlink_out_of_the_directory_given(tmp_path, command, content):
    outside, project = tmp_path / "outside", tmp_path / "project"
    outside.mkdir()
    project.mkdir()
    (outside / "shared.py").write_text(content)
    (outside / "lib").mkdir()
    (outside / "lib" / "deep.py").write_text(content)
    (project / "own.py").write_text(content)
    (project / "link.py").symlink_to(outside / "shared.py")
    (project / "linked_dir").symlink_to(outside / "lib", target_is_directory=True)
    result = ddpify(*command, "project", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert (outside / "shared.py").read_text() == content
    assert (outside / "lib" / "deep.py").read_text() == content
    assert (project / "own.py").read_text() != content  # the files inside were written
    skipped = [line for line in result.stderr.splitlines() if "skipped: a symlink to" in line]
    assert len(skipped) == 2 and "link.py" in skipped[0] + skipped[1] and "linked_dir" in skipped[0] + skipped[1]
    named = ddpify(*command, "project/link.py", cwd=tmp_path)  # a link named by the user is followed
    assert named.returncode == 0 and (outside / "shared.py").read_text() != content, named.stderr


def test_in_place_refuses_a_read_only_file_like_black_and_ruff(tmp_path):
    prefix = _without_read_override()
    (tmp_path / "locked.py").write_bytes(BASIC)
    (tmp_path / "locked.py").chmod(0o444)
    (tmp_path / "open.py").write_bytes(BASIC)
    if prefix and subprocess.run([*prefix, "sh", "-c", ": >> locked.py"], cwd=tmp_path).returncode == 0:
        pytest.skip("cannot drop the capability that lets root write a read-only file")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([*prefix, sys.executable, "-m", "ddpify", "convert", "--to", "ddp", "--in-place",
                             "locked.py", "open.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert result.returncode == 2, result.stderr
    assert "locked.py: cannot write: read-only file (permission denied); left unchanged" in result.stderr
    assert (tmp_path / "locked.py").read_bytes() == BASIC
    assert (tmp_path / "locked.py").stat().st_mode & 0o777 == 0o444
    assert (tmp_path / "open.py").read_bytes() != BASIC


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file another owner")
def test_in_place_keeps_the_files_owner_and_group(tmp_path):
    path = tmp_path / "theirs.py"
    path.write_bytes(BASIC)
    os.chown(path, 4321, 8765)
    path.chmod(0o640)
    result = ddpify("convert", "--to", "ddp", "--in-place", "theirs.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    after = path.stat()
    assert (after.st_uid, after.st_gid, after.st_mode & 0o777) == (4321, 8765, 0o640)
    assert path.read_bytes() != BASIC


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_verify_leaves_no_process_behind_even_one_that_called_setsid(tmp_path):
    cases = ROOT / "tests" / "verify_cases"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DDPIFY_TEST_PID_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "ddpify", "verify", "train.py", "--to", "ddp", "--against",
                             "ddp_setsid_child.py", "--json"], cwd=cases, env=env, capture_output=True, text=True,
                            timeout=TIMEOUT)
    sleepers = [int(p.name) for p in tmp_path.iterdir()]
    try:
        assert json.loads(result.stdout)["verdict"] == "equivalent", result.stdout + result.stderr
        assert len(sleepers) == 2  # one per rank
        assert [pid for pid in sleepers if _alive(pid)] == []
    finally:
        for pid in sleepers:
            if _alive(pid):
                os.kill(pid, 9)



STUCK_LAUNCHER = """import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(child.pid))
sys.stdin.readline()
time.sleep(120)
"""


def test_a_launcher_past_its_timeout_is_reported_and_killed_with_its_group(tmp_path, monkeypatch):
    """verify's timeout path: a launcher that never writes its verdict is an error within the plan's
    timeout plus the slack, and kill_group ends it and the rank it started in its group."""
    from types import SimpleNamespace

    from ddpify.verify import runner

    monkeypatch.setattr(runner, "LAUNCHER_SLACK_S", 0.5)
    pid_file = tmp_path / "rank.pid"
    launcher = subprocess.Popen([sys.executable, "-c", STUCK_LAUNCHER, str(pid_file)], stdin=subprocess.PIPE,
                                text=True, start_new_session=True)
    plan = SimpleNamespace(save=lambda: "plan.json", timeout=1, result_path=str(tmp_path / "result.json"), outdir=str(tmp_path))
    result = runner.run_plan(launcher, plan)
    rank = int(pid_file.read_text())
    try:
        assert result["verdict"] == "error" and "did not finish within 1.5 s" in result["message"], result
        runner.kill_group(launcher)
        assert launcher.returncode == -signal.SIGKILL
        time.sleep(0.5)  # the orphaned rank is reaped by init
        assert not _alive(rank)
    finally:
        if _alive(rank):
            os.kill(rank, signal.SIGKILL)

def test_a_script_with_1500_top_level_statements_converts():
    from ddpify.convert import convert_source

    constants = "".join(f"SETTING_{i} = {i}\n" for i in range(1500))
    text = BASIC.decode().replace("\n\nclass MLP", f"\n{constants}\n\nclass MLP", 1)
    output = convert_source(text, "ddp").output
    assert "import torch.distributed as dist\n" in output and "model = DDP(\n        model,\n" in output
    assert output.count("SETTING_") == 1500


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not a readable notebook: NotJSONError"),
    (json.dumps([1, 2]), "is not a readable notebook: AttributeError"),
    (json.dumps({"cells": 3}), "is not a readable notebook: "),
])
def test_explain_reads_notebooks_and_names_a_broken_one_in_one_line(tmp_path, monkeypatch, content, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.ipynb").write_text(content)
    result = CliRunner().invoke(cli, ["explain", "broken.ipynb"])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: broken.ipynb: {message}") and result.output.count("\n") == 1


def test_explain_explains_a_notebooks_code_cells(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notebook = {"nbformat": 4, "nbformat_minor": 4, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": BASIC.decode()}]}
    (tmp_path / "train.ipynb").write_text(json.dumps(notebook))
    result = CliRunner().invoke(cli, ["explain", "train.ipynb"])
    assert result.exit_code == 0, result.output
    assert "single-gpu script" in result.output and "class MLP" in result.output


@pytest.mark.parametrize("command", [["lint"], ["convert", "--to", "ddp", "--check"]])
def test_fifos_named_or_walked_are_one_line_errors_not_hangs(tmp_path, command):
    os.mkfifo(tmp_path / "named.py")
    (tmp_path / "tree").mkdir()
    os.mkfifo(tmp_path / "tree" / "walked.py")
    (tmp_path / "tree" / "good.py").write_bytes(BASIC)
    result = ddpify(*command, "named.py", "tree", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    output = result.stdout + result.stderr
    assert "named.py: not a regular file" in output and "walked.py: not a regular file" in output
    assert "Traceback" not in output


def test_a_megabyte_line_converts_and_lints(tmp_path):
    text = BASIC.replace(b"import torch\n", b"import torch\nBLOB = '" + b"x" * 1_000_000 + b"'\n", 1)
    (tmp_path / "long.py").write_bytes(text)
    assert ddpify("convert", "--to", "ddp", "long.py", "-q", cwd=tmp_path).returncode == 0
    assert (tmp_path / "long_ddp.py").read_bytes().count(b"x" * 1_000_000) == 1
    assert ddpify("lint", "long.py", cwd=tmp_path).returncode == 0


def test_a_file_deleted_after_it_was_found_is_a_one_line_error(tmp_path):
    from ddpify.lint.engine import Options, collect_files, lint_files
    from ddpify.lint.config import Config

    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("import torch\nimport torch.distributed as dist\nstate = torch.load('x')\n")
    files, errors = collect_files([str(tmp_path)], Config())
    (tmp_path / "a.py").unlink()
    reports = lint_files(files, Options(), jobs=1)
    assert errors == [] and [r.errors for r in reports] == [[f"{tmp_path / 'a.py'}: no such file or directory"], []]
