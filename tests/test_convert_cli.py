"""`ddpify convert ... --to ddp` from the command line: where it writes, what it prints, exit codes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.convert import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EXPECTED = FIXTURES / "expected" / "ddp"
LAUNCH = "launch: torchrun --standalone --nproc_per_node=<GPUS> {}"


def invoke(*args: str):
    return CliRunner().invoke(cli, ["convert", *map(str, args)], catch_exceptions=False)


def copy_fixture(tmp_path: Path, name: str = "basic_main.py", as_name: str | None = None) -> Path:
    target = tmp_path / (as_name or name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / name, target)
    return target


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ----- default: <name>_ddp.py beside the input ---------------------------------------------------
def test_default_writes_name_ddp_beside_the_input_and_leaves_the_original(tmp_path):
    script = copy_fixture(tmp_path)
    before = script.read_bytes()
    mtime = script.stat().st_mtime_ns
    result = invoke(script, "--to", "ddp")
    assert result.exit_code == 0, result.output
    written = tmp_path / "basic_main_ddp.py"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basic_main.py", "basic_main_ddp.py"]
    assert written.read_text() == (EXPECTED / "basic_main.py").read_text()
    assert script.read_bytes() == before and script.stat().st_mtime_ns == mtime
    assert f"wrote {written}" in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1] == LAUNCH.format(written)


def test_one_line_per_change_with_the_original_line_numbers(tmp_path):
    script = copy_fixture(tmp_path, "checkpoint_resume.py")
    expected = convert_source(script.read_text(), "ddp", path=str(script))
    result = invoke(script, "--to", "ddp")
    assert result.exit_code == 0, result.output
    reported = [line for line in result.stdout.splitlines() if line.startswith(f"{script}:")]
    assert reported == (
        [f"{script}:{c.line}: [{c.transform}] {c.message}" for c in expected.changes]
        + [f"{script}:{a.line}: warning: {a.message}" for a in expected.advice]
    )
    assert len(reported) >= 10
    source_lines = script.read_text().splitlines()
    for change in expected.changes:  # the line numbers point at what the message talks about
        if change.transform == "rank0" and "print" in change.message:
            assert "print(" in source_lines[change.line - 1]
        if change.transform == "sampler" and "sharded" in change.message:
            assert "DataLoader(" in source_lines[change.line - 1]
        if change.transform == "module":
            assert change.message.split(" -> ")[0] in source_lines[change.line - 1]


def test_quiet_prints_only_warnings(tmp_path):
    script = copy_fixture(tmp_path, "validation_accuracy.py")
    result = invoke(script, "--to", "ddp", "-q")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines and all(": warning: " in line for line in lines)
    assert (tmp_path / "validation_accuracy_ddp.py").exists()


# ----- -o, --in-place, --diff, --check -------------------------------------------------------------
def test_output_file(tmp_path):
    script = copy_fixture(tmp_path)
    out = tmp_path / "elsewhere" / "out.py"
    out.parent.mkdir()
    result = invoke(script, "--to", "ddp", "-o", out)
    assert result.exit_code == 0, result.output
    assert out.read_text() == (EXPECTED / "basic_main.py").read_text()
    assert not (tmp_path / "basic_main_ddp.py").exists()
    assert result.stdout.splitlines()[-1] == LAUNCH.format(out)


def test_output_to_stdout_keeps_the_report_on_stderr(tmp_path):
    script = copy_fixture(tmp_path)
    before = snapshot(tmp_path)
    result = invoke(script, "--to", "ddp", "-o", "-")
    assert result.exit_code == 0, result.output
    assert result.stdout == (EXPECTED / "basic_main.py").read_text()
    assert f"{script}:" in result.stderr and "[wrap]" in result.stderr
    assert snapshot(tmp_path) == before


def test_in_place(tmp_path):
    script = copy_fixture(tmp_path)
    result = invoke(script, "--to", "ddp", "--in-place")
    assert result.exit_code == 0, result.output
    assert script.read_text() == (EXPECTED / "basic_main.py").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basic_main.py"]
    again = invoke(script, "--to", "ddp", "--in-place")
    assert again.exit_code == 0
    assert "already distributed" in again.output
    assert script.read_text() == (EXPECTED / "basic_main.py").read_text()


def test_in_place_keeps_crlf_and_the_file_mode(tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes((FIXTURES / "basic_main.py").read_bytes().replace(b"\n", b"\r\n"))
    script.chmod(0o754)
    result = invoke(script, "--to", "ddp", "--in-place")
    assert result.exit_code == 0, result.output
    data = script.read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n") > 80
    assert data.replace(b"\r\n", b"\n") == (EXPECTED / "basic_main.py").read_bytes()
    assert script.stat().st_mode & 0o777 == 0o754


def test_diff_writes_nothing(tmp_path):
    script = copy_fixture(tmp_path)
    before = snapshot(tmp_path)
    result = invoke(script, "--to", "ddp", "--diff")
    assert result.exit_code == 0, result.output
    assert snapshot(tmp_path) == before
    diff = result.stdout.splitlines()
    assert diff[0] == f"--- a/{script}" and diff[1] == f"+++ b/{script}"
    assert "+    model = DDP(" in diff and "+        device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None," in diff
    assert "-    loader = DataLoader(dataset, batch_size=16, shuffle=True)" in diff
    # the diff is exactly the conversion: its '+' and ' ' lines make the converted file
    hunks = [line[1:] for line in diff[2:] if line[:1] in "+ " and not line.startswith("+++")]
    assert set(hunks) <= set((EXPECTED / "basic_main.py").read_text().splitlines())
    assert "[wrap]" in result.stderr  # the report is not mixed into the diff


def test_check_exits_1_when_there_is_work_and_0_on_converted_output(tmp_path):
    script = copy_fixture(tmp_path)
    before = snapshot(tmp_path)
    result = invoke(script, "--to", "ddp", "--check")
    assert result.exit_code == 1
    assert f"would convert {script}" in result.stdout
    assert snapshot(tmp_path) == before
    converted = tmp_path / "done.py"
    shutil.copy(EXPECTED / "basic_main.py", converted)
    clean = invoke(converted, "--to", "ddp", "--check")
    assert clean.exit_code == 0, clean.output
    assert "would convert" not in clean.output


@pytest.mark.parametrize("options", [["-o", "x.py", "--in-place"], ["--diff", "--check"], ["--in-place", "--diff"]])
def test_conflicting_modes_are_a_usage_error(tmp_path, options):
    script = copy_fixture(tmp_path)
    result = invoke(script, "--to", "ddp", *options)
    assert result.exit_code == 2
    assert "choose at most one" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basic_main.py"]


def test_output_file_takes_one_input(tmp_path):
    a, b = copy_fixture(tmp_path), copy_fixture(tmp_path, "notebook_style.py")
    result = invoke(a, b, "--to", "ddp", "-o", tmp_path / "out.py")
    assert result.exit_code == 2
    assert not (tmp_path / "out.py").exists()


def test_global_batch_size(tmp_path):
    script = copy_fixture(tmp_path)
    result = invoke(script, "--to", "ddp", "--batch-size", "global", "-o", "-")
    assert result.exit_code == 0
    assert "batch_size=16 // WORLD_SIZE" in result.stdout
    assert "batch_size -> batch_size // WORLD_SIZE" in result.stderr


# ----- several files, directories, errors ------------------------------------------------------
TORCH_SCRIPT = (FIXTURES / "basic_main.py").read_text()


def make_tree(root: Path) -> None:
    files = {
        "train.py": TORCH_SCRIPT,
        "pkg/model_train.py": TORCH_SCRIPT,
        "utils.py": "def add(a, b):\n    return a + b\n",
        ".hidden/secret_train.py": TORCH_SCRIPT,
        "venv/lib/train_in_venv.py": TORCH_SCRIPT,
        "myenv/pyvenv.cfg": "home = /usr/bin\n",
        "myenv/lib/train_in_env.py": TORCH_SCRIPT,
        "__pycache__/cached.py": TORCH_SCRIPT,
        "notes.txt": "import torch\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_directories_skip_hidden_dirs_venvs_and_files_without_torch(tmp_path):
    make_tree(tmp_path)
    check = invoke(tmp_path, "--to", "ddp", "--check")
    assert check.exit_code == 1
    assert sorted(re.findall(r"^would convert (.*)$", check.stdout, re.M)) == [
        str(tmp_path / "pkg" / "model_train.py"), str(tmp_path / "train.py")]
    assert "utils.py" not in check.output  # found by the walk, not named: skipped without a word
    before = snapshot(tmp_path)
    result = invoke(tmp_path, "--to", "ddp")
    assert result.exit_code == 0, result.output
    new = sorted(set(snapshot(tmp_path)) - set(before))
    assert new == ["pkg/model_train_ddp.py", "train_ddp.py"]
    assert all(snapshot(tmp_path)[k] == v for k, v in before.items())
    # walking again: the *_ddp.py files are already distributed, nothing new is written
    again = invoke(tmp_path, "--to", "ddp")
    assert again.exit_code == 0, again.output
    assert sorted(snapshot(tmp_path)) == sorted([*before, *new])
    assert "already distributed" in again.output


def test_a_named_file_without_torch_is_left_alone_with_a_word(tmp_path):
    plain = tmp_path / "utils.py"
    plain.write_text("def add(a, b):\n    return a + b\n")
    result = invoke(plain, "--to", "ddp")
    assert result.exit_code == 0
    assert result.output.strip() == f"{plain}: does not use torch; left alone"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["utils.py"]


def test_a_syntax_error_exits_2_and_the_other_files_are_still_converted(tmp_path):
    bad = tmp_path / "a_bad.py"
    bad.write_text("import torch\n\n\ndef main(:\n    pass\n")
    good = copy_fixture(tmp_path, as_name="b_good.py")
    result = invoke(bad, good, "--to", "ddp")
    assert result.exit_code == 2
    assert re.search(rf"^error: {re.escape(str(bad))}:4: ", result.stderr, re.M), result.stderr
    assert (tmp_path / "b_good_ddp.py").read_text() == (EXPECTED / "basic_main.py").read_text()
    assert not (tmp_path / "a_bad_ddp.py").exists()
    assert bad.read_text() == "import torch\n\n\ndef main(:\n    pass\n"


def test_a_missing_path_exits_2_and_the_rest_goes_on(tmp_path):
    good = copy_fixture(tmp_path)
    result = invoke(tmp_path / "nope.py", good, "--to", "ddp")
    assert result.exit_code == 2
    assert "nope.py" in result.stderr
    assert (tmp_path / "basic_main_ddp.py").exists()


def test_jobs_convert_in_worker_processes_with_the_serial_reports_files_and_exit_code(tmp_path):
    runs = {}
    for jobs in ("1", "2"):
        tree = tmp_path / jobs
        make_tree(tree)
        for name in ("checkpoint_resume.py", "basic_main.py", "two_loaders.py"):
            copy_fixture(tree, name)
        (tree / "a_bad.py").write_text("import torch\n\n\ndef main(:\n    pass\n")
        result = invoke(tree, "--to", "ddp", "--jobs", jobs)
        runs[jobs] = (result.exit_code, result.stdout.replace(str(tree), "<tree>"),
                      result.stderr.replace(str(tree), "<tree>"), snapshot(tree))
    assert runs["2"] == runs["1"]
    assert runs["1"][0] == 2 and "would" not in runs["1"][1] and "basic_main_ddp.py" in runs["1"][3]


# ----- as a program ----------------------------------------------------------------------------
def test_python_dash_m_ddpify(tmp_path):
    script = copy_fixture(tmp_path, "notebook_style.py")
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "ddpify", "convert", script.name, "--to", "ddp"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "notebook_style_ddp.py").read_text() == (EXPECTED / "notebook_style.py").read_text()
    assert proc.stdout.splitlines()[-1] == LAUNCH.format("notebook_style_ddp.py")
    assert re.search(r"^notebook_style\.py:\d+: \[setup\] ", proc.stdout, re.M)
    check = subprocess.run(
        [sys.executable, "-m", "ddpify", "convert", "notebook_style_ddp.py", "--to", "ddp", "--check"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    assert check.returncode == 0, check.stderr


def test_help_names_the_modes():
    result = CliRunner().invoke(cli, ["convert", "--help"])
    assert result.exit_code == 0
    for option in ("--to", "--in-place", "--diff", "--check", "--batch-size", "--eval", "--log-loss", "-o, --output"):
        assert option in result.output


def test_fsdp_options_are_in_the_help_and_refused_for_other_targets(tmp_path):
    help_text = CliRunner().invoke(cli, ["convert", "--help"]).output
    assert "--checkpoint [full|sharded]" in help_text and "--mixed-precision [keep|policy]" in help_text
    script = copy_fixture(tmp_path, "checkpoint_resume.py")
    refused = CliRunner().invoke(cli, ["convert", str(script), "--to", "ddp", "--checkpoint", "sharded"])
    assert refused.exit_code == 2 and "apply to --to fsdp only" in refused.output
    written = invoke(script, "--to", "fsdp", "--checkpoint", "sharded", "-o", tmp_path / "out.py")
    assert written.exit_code == 0 and "dcp.save(" in (tmp_path / "out.py").read_text()
