"""`ddpify lint` as ruff users expect it: stdin, --exit-zero, --statistics, concise/full output,
--color, unused suppressions (DDP900), --add-noqa, --unsafe-fixes enabling fixes, and ALL."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from ddpify.cli import cli

HEAD = 'import torch\nimport torch.distributed as dist\n\ndist.init_process_group("gloo")\n'
BAD = HEAD + 'state = torch.load("ckpt.pt")\nprint("hi")\n'  # DDP001 line 5 (unsafe fix), DDP007 line 6 (unsafe fix)
SAFE_FIX = HEAD + "from torch.utils.data import DataLoader, DistributedSampler\n" \
    "loader = DataLoader(range(8), sampler=DistributedSampler(range(8)), shuffle=True)\n"  # DDP004: safe fix


def lint(*args: str, stdin: str | None = None):
    return CliRunner().invoke(cli, ["lint", *args], input=stdin)


def write(tmp_path: Path, text: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_stdin_is_linted_under_its_stdin_filename():
    result = lint("-", "--stdin-filename", "scripts/train.py", "--output-format", "concise", stdin=BAD)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "scripts/train.py:5:9: DDP001 torch.load() without map_location loads every rank's copy onto the GPU it was saved from (usually cuda:0)",
        "scripts/train.py:6:1: DDP007 print on every rank: the output is repeated world-size times",
    ]


def test_stdin_filename_matches_per_file_ignores(tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.ddpify]\nper-file-ignores = { "scripts/*.py" = ["DDP007"] }\n')
    result = lint("--config", str(config), "-", "--stdin-filename", str(tmp_path / "scripts" / "train.py"), stdin=BAD)
    assert "DDP001" in result.stdout and "DDP007" not in result.stdout


def test_stdin_fix_prints_the_fixed_source_and_findings_go_to_stderr():
    result = lint("-", "--fix", stdin=SAFE_FIX + 'print("hi")\n')
    assert result.stdout == SAFE_FIX.replace(", shuffle=True", "") + 'print("hi")\n'
    assert "DDP007" in result.stderr and result.exit_code == 1


def test_exit_zero_keeps_findings_but_exits_0(tmp_path):
    result = lint("--exit-zero", write(tmp_path, BAD))
    assert result.exit_code == 0 and "DDP001" in result.stdout


def test_exit_zero_still_fails_on_errors(tmp_path):
    result = lint("--exit-zero", str(tmp_path / "missing.py"))
    assert result.exit_code == 2


def test_statistics_count_findings_per_rule(tmp_path):
    path = write(tmp_path, BAD + 'print("again")\n')
    result = lint("--statistics", path)
    assert result.stdout.splitlines() == ["2\tDDP007\t    log-on-every-rank", "1\tDDP001\t    torch-load-without-map-location"]
    rows = json.loads(lint("--statistics", "--output-format", "json", "--unsafe-fixes", path).stdout)
    assert rows == [{"code": "DDP007", "name": "log-on-every-rank", "count": 2, "fixable": True},
                    {"code": "DDP001", "name": "torch-load-without-map-location", "count": 1, "fixable": True}]


def test_full_and_text_are_the_same_and_concise_is_one_line_each(tmp_path):
    path = write(tmp_path, SAFE_FIX)
    full, text = lint("--output-format", "full", path).stdout, lint("--output-format", "text", path).stdout
    assert full == text and " 6 | loader = DataLoader(" in full
    assert lint("--output-format", "concise", path).stdout == (
        f"{path}:6:69: DDP004 [*] `shuffle=True` with `sampler=` raises ValueError; the sampler does the shuffling\n"
    )


def test_color_always_colours_findings_and_diffs_never_does_not(tmp_path):
    path = write(tmp_path, SAFE_FIX)
    assert "\x1b[" in lint("--color", "always", path).stdout
    assert "\x1b[" in lint("--color", "always", "--diff", path).stdout
    assert "\x1b[" not in lint("--color", "never", path).stdout
    assert "\x1b[" not in lint(path).stdout  # auto: not a terminal


def test_unsafe_fixes_enable_but_do_not_apply(tmp_path):
    path = write(tmp_path, BAD)
    result = lint("--unsafe-fixes", path)
    assert Path(path).read_text() == BAD
    assert "2 fixable with --fix" in result.stderr
    lint("--unsafe-fixes", "--fix", path)
    assert 'map_location="cpu"' in Path(path).read_text()


def test_fix_alone_applies_only_safe_fixes(tmp_path):
    path = write(tmp_path, SAFE_FIX + 'state = torch.load("ckpt.pt")\n')
    lint("--fix", path)
    fixed = Path(path).read_text()
    assert "shuffle=True" not in fixed and "map_location" not in fixed


def test_unused_suppression_is_off_by_default_and_judges_only_what_ran(tmp_path):
    path = write(tmp_path, BAD.replace('torch.load("ckpt.pt")', 'torch.load("ckpt.pt")  # ddpify: ignore[DDP001, DDP006]')
                 + "x = 1  # noqa: E501\n")
    assert "DDP900" not in lint(path).stdout
    result = lint("--extend-select", "DDP900", "--output-format", "concise", path)
    lines = [line for line in result.stdout.splitlines() if "DDP900" in line]
    assert lines == [f"{path}:5:32: DDP900 [*] unused suppression of DDP006: it suppresses no finding"]
    lint("--extend-select", "DDP900", "--fix", path)
    assert 'torch.load("ckpt.pt")  # ddpify: ignore[DDP001]\n' in Path(path).read_text()


def test_add_noqa_silences_every_current_finding(tmp_path):
    multi = 'print(\n    "a",\n    """x\ny""",\n)\n'
    path = write(tmp_path, BAD + multi + "x = 1  # ddpify: ignore[DDP006]\n")
    result = lint("--add-noqa", path)
    assert result.exit_code == 0 and "added 3 suppression comments" in result.stderr
    text = Path(path).read_text()
    assert 'state = torch.load("ckpt.pt")  # ddpify: ignore[DDP001]\n' in text
    assert 'print("hi")  # ddpify: ignore[DDP007]\n' in text
    assert '    """x\ny""",\n)  # ddpify: ignore[DDP007]\n' in text  # the statement's last line, not inside the string
    assert lint(path).exit_code == 0
    assert lint("--extend-select", "DDP900", path).exit_code == 1  # DDP006 suppresses nothing


def test_all_selects_every_rule_even_those_off_by_default(tmp_path):
    path = write(tmp_path, HEAD + "x = 1  # ddpify: ignore[DDP006]\n")
    assert lint(path).exit_code == 0
    everything = lint("--select", "ALL", path).stdout
    assert "DDP900" in everything and "DDP025" in everything  # both off by default (an unseeded DDP script)
    assert lint("--select", "ALL", "--ignore", "DDP9,DDP025", path).exit_code == 0
    assert lint("--select", "ALL", "--ignore", "ALL", write(tmp_path, BAD, "bad.py")).exit_code == 0
