"""CLI-level robustness of `ddpify convert` and `ddpify lint`.

Bad inputs give one clear line naming the file (and the line where there is one), the other files
of the same call are still processed, and the exit status is 2. The bytes of a user's file survive
an in-place conversion exactly (line endings, tabs, trailing whitespace, encodings, mode bits).
The static commands never import or execute the user's code. Large and deeply nested inputs and
big directory trees do not crash.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import run_ddpify

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
BASIC = (FIXTURES / "basic_main.py").read_bytes()
TIMEOUT = 300


def ddpify(*args, cwd: Path, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    """Run `python -m ddpify ARGS` in `cwd` as a user would, in a process of its own (forked from the
    tests' fork server unless DDPIFY_TEST_FORK=0), so nothing leaks."""
    return run_ddpify(list(map(str, args)), cwd, {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}, timeout)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout


# ----- bad inputs -------------------------------------------------------------------------------
BAD_INPUTS = {
    # name: (bytes, expected line number in the message or None)
    "syntax_error": (b"import torch\n\nx = (1,\ny = 2\nfor\n", None),
    "python2": (b"import torch\n\nprint 'hello'\n", 3),
    "binary": (b"\x7fELF\x02\x01\x01\x00\x00\x00torch\x00\x00\x00", None),
    "non_utf8": (b"import torch\n# caf\xe9\nx = 1\n", 2),
}


def _good(tmp_path: Path) -> Path:
    good = tmp_path / "good.py"
    good.write_bytes(BASIC)
    return good


def _error_lines(stderr: str, name: str) -> list[str]:
    return [line for line in stderr.splitlines() if name in line]


@pytest.mark.parametrize("command", ["convert", "lint"])
@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_bad_file_is_one_line_error_and_others_processed(tmp_path, command, kind):
    data, line = BAD_INPUTS[kind]
    bad = tmp_path / f"bad_{kind}.py"
    bad.write_bytes(data)
    good = _good(tmp_path)
    args = ["convert", bad.name, good.name, "--to", "ddp"] if command == "convert" else ["lint", bad.name, good.name]
    result = ddpify(*args, cwd=tmp_path)
    no_traceback(result)
    assert result.returncode == 2, (result.stdout, result.stderr)
    errors = _error_lines(result.stderr, bad.name)
    assert len(errors) == 1, result.stderr
    if line is not None:
        assert f"{bad.name}:{line}:" in errors[0], errors[0]
    else:
        assert re.search(rf"{re.escape(bad.name)}(:\d+)?:", errors[0]), errors[0]
    # the good file was still processed
    if command == "convert":
        assert (tmp_path / "good_ddp.py").exists(), result.stdout + result.stderr
        assert not (tmp_path / f"bad_{kind}_ddp.py").exists()
    else:
        assert re.search(r"[12] files? scanned", result.stderr), result.stderr


def test_lint_good_file_alone_has_no_errors(tmp_path):
    good = _good(tmp_path)
    result = ddpify("lint", good.name, cwd=tmp_path)
    no_traceback(result)
    assert result.returncode in (0, 1), result.stderr


@pytest.mark.parametrize("command", ["convert", "lint"])
def test_missing_path(tmp_path, command):
    good = _good(tmp_path)
    args = ["convert", "nope.py", good.name, "--to", "ddp"] if command == "convert" else ["lint", "nope.py", good.name]
    result = ddpify(*args, cwd=tmp_path)
    no_traceback(result)
    assert result.returncode == 2
    assert len(_error_lines(result.stderr, "nope.py")) == 1, result.stderr
    if command == "convert":
        assert (tmp_path / "good_ddp.py").exists()


@pytest.mark.parametrize("command", ["convert", "lint"])
def test_symlink_loop_in_walked_dir(tmp_path, command):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "train.py").write_bytes(BASIC)
    (tree / "sub" / "loop").symlink_to(tree, target_is_directory=True)
    (tree / "self").symlink_to("self")  # a link to itself: ELOOP on stat
    args = ["convert", "tree", "--to", "ddp"] if command == "convert" else ["lint", "tree"]
    result = ddpify(*args, cwd=tmp_path)
    no_traceback(result)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert any("loop" in line for line in result.stderr.splitlines()), result.stderr
    if command == "convert":
        assert (tree / "sub" / "train_ddp.py").exists()
    else:
        assert "1 file scanned" in result.stderr


@pytest.mark.parametrize("command", ["convert", "lint"])
@pytest.mark.parametrize("content", [b"", b"x = 1\nprint(x)\n"], ids=["empty", "no_torch"])
def test_empty_and_non_torch_files_are_not_errors(tmp_path, command, content):
    other = tmp_path / "other.py"
    other.write_bytes(content)
    args = ["convert", other.name, "--to", "ddp"] if command == "convert" else ["lint", other.name]
    result = ddpify(*args, cwd=tmp_path)
    no_traceback(result)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "error" not in result.stderr.lower()
    assert other.read_bytes() == content
    assert not (tmp_path / "other_ddp.py").exists()


# ----- faithful output --------------------------------------------------------------------------
def _crlf(b: bytes) -> bytes:
    return b.replace(b"\n", b"\r\n")


def _tabs(b: bytes) -> bytes:
    return b.replace(b"    ", b"\t")


def _no_final_newline(b: bytes) -> bytes:
    return b.rstrip(b"\n")


def _bom(b: bytes) -> bytes:
    return b"\xef\xbb\xbf" + b


LATIN1_HEAD = b"# -*- coding: latin-1 -*-\n# caf\xe9 cr\xe8me br\xfbl\xe9e\n"


def _latin1(b: bytes) -> bytes:
    return LATIN1_HEAD + b


TRANSFORMS = {"crlf": _crlf, "tabs": _tabs, "no_final_newline": _no_final_newline, "bom": _bom, "latin1": _latin1}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> bytes:
    """The in-place DDP conversion of the untouched fixture."""
    work = tmp_path_factory.mktemp("baseline")
    script = work / "train.py"
    script.write_bytes(BASIC)
    result = ddpify("convert", script.name, "--to", "ddp", "--in-place", cwd=work)
    assert result.returncode == 0, result.stderr
    out = script.read_bytes()
    assert out != BASIC
    return out


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_in_place_conversion_commutes_with_byte_transforms(tmp_path, baseline, name):
    """convert(transform(x)) == transform(convert(x)): the transform's bytes survive everywhere."""
    transform = TRANSFORMS[name]
    script = tmp_path / "train.py"
    script.write_bytes(transform(BASIC))
    script.chmod(0o755)
    result = ddpify("convert", script.name, "--to", "ddp", "--in-place", cwd=tmp_path)
    no_traceback(result)
    assert result.returncode == 0, result.stderr
    out = script.read_bytes()
    expected = transform(baseline)
    if out != expected:
        diff = b"".join(difflib.diff_bytes(difflib.unified_diff, expected.splitlines(True), out.splitlines(True)))
        pytest.fail(diff.decode("latin-1"))
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


def test_trailing_whitespace_on_unchanged_lines_survives(tmp_path, baseline):
    kept = set(BASIC.splitlines()) & set(baseline.splitlines())
    lines = BASIC.split(b"\n")
    marked = [line + b" \t " if line in kept and line.strip() else line for line in lines]
    script = tmp_path / "train.py"
    script.write_bytes(b"\n".join(marked))
    result = ddpify("convert", script.name, "--to", "ddp", "--in-place", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out_lines = script.read_bytes().split(b"\n")
    for line in marked:
        if line.endswith(b" \t ") and not line.lstrip().startswith((b"import", b"from")):
            assert line in out_lines, line


def test_mode_bits_kept_on_in_place(tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes(BASIC)
    script.chmod(0o750)
    result = ddpify("convert", script.name, "--to", "dp", "--in-place", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert script.read_bytes() != BASIC
    assert stat.S_IMODE(script.stat().st_mode) == 0o750


# ----- never runs user code ---------------------------------------------------------------------
def test_static_commands_never_execute_user_code(tmp_path):
    marker = tmp_path / "MARKER"
    evil = (
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nraise SystemExit(42)\n".encode()
        + BASIC
    )
    script = tmp_path / "evil.py"
    script.write_bytes(evil)
    for args in (["convert", "evil.py", "--to", "ddp"], ["convert", "evil.py", "--to", "dp", "--diff"],
                 ["convert", "evil.py", "--to", "ddp", "--check"], ["lint", "evil.py"], ["lint", "."]):
        result = ddpify(*args, cwd=tmp_path)
        no_traceback(result)
        assert result.returncode in (0, 1), (args, result.stderr)
        assert not marker.exists(), args
    assert (tmp_path / "evil_ddp.py").exists()


# ----- scale ------------------------------------------------------------------------------------
def big_script(target_lines: int = 20_000) -> str:
    """A training-like script of about `target_lines` lines: many models and helpers, one main loop."""
    parts = [
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
    ]
    i = 0
    while sum(p.count("\n") for p in parts) < target_lines - 40:
        parts.append(
            f"""
class Model{i}(nn.Module):
    def __init__(self, dim={16 + i % 7}):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if h.sum() > {i}:
            h = h * 0.5
        return self.fc2(h)


def helper_{i}(x, scale={i}):
    y = x * scale
    for k in range(3):
        y = y + k
    return {{"value": y, "index": {i}}}
"""
        )
        i += 1
    parts.append(
        """

def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(64, 16)
    y = torch.randint(0, 4, (64,))
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = Model0().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(2):
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
        print(epoch, loss.item())
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
"""
    )
    return "".join(parts)


def test_big_script_converts_and_lints(tmp_path):
    """A 5,000-line script (hundreds of models and helpers) converts and lints; the figures for
    20,000 and 50,000 lines are bench/bench_scale.py's (speed belongs to benchmarks, not the suite)."""
    script = tmp_path / "big.py"
    text = big_script(5_000)
    assert text.count("\n") >= 4_900
    script.write_text(text)
    result = ddpify("lint", script.name, cwd=tmp_path, timeout=1800)
    no_traceback(result)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    assert "1 file scanned" in result.stderr
    result = ddpify("convert", script.name, "--to", "ddp", cwd=tmp_path, timeout=1800)
    no_traceback(result)
    assert result.returncode == 0, result.stderr[-2000:]
    out = (tmp_path / "big_ddp.py").read_text()
    compile(out, "big_ddp.py", "exec")


DEEP = {
    "parens_200": "import torch\nx = " + "(" * 200 + "1" + ")" * 200 + "\nprint(x)\n",
    "sum_1000": "import torch\na = 1\nx = " + " + ".join(["a"] * 1000) + "\nprint(x)\n",
    "calls_150": "import torch\nx = " + "torch.relu(" * 150 + "1" + ")" * 150 + "\n",
    "lists_90": "import torch\nx = " + "[" * 90 + "]" * 90 + "\n",
    "if_nest_90": "import torch\n" + "".join(" " * i + "if True:\n" for i in range(90)) + " " * 90 + "pass\n",
}


@pytest.mark.parametrize("name", sorted(DEEP))
@pytest.mark.parametrize("command", ["convert", "lint"])
def test_deeply_nested_input_does_not_crash(tmp_path, name, command):
    script = tmp_path / "deep.py"
    script.write_text(DEEP[name])
    args = ["convert", "deep.py", "--to", "ddp"] if command == "convert" else ["lint", "deep.py"]
    result = ddpify(*args, cwd=tmp_path)
    no_traceback(result)
    assert result.returncode in (0, 1, 2), result.stderr
    if result.returncode == 2:  # a clean error naming the file
        assert len(_error_lines(result.stderr, "deep.py")) == 1, result.stderr


# one finding a file (DDP001: torch.load without map_location), so the findings name every file linted
SMALL = "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\nstate = torch.load('ckpt.pt')\n"


def make_tree(root: Path, n: int = 5_000) -> dict[str, int]:
    """n small files in 50 dirs (fewer when n < 50): some ignored by .gitignore, some by [tool.ddpify] exclude."""
    counts = {"total": 0, "gitignored": 0, "excluded": 0}
    dirs = max(1, min(50, n))
    per_dir = n // dirs
    for d in range(dirs):
        sub = root / f"pkg{d:02d}"
        sub.mkdir(parents=True)
        for f in range(per_dir):
            name = f"mod{f:03d}.py"
            if (d * per_dir + f) % 10 == 0:
                name = f"gen_{f:03d}.py"  # .gitignore: gen_*.py
                counts["gitignored"] += 1
            elif d % 10 == 9:
                counts["excluded"] += 1  # [tool.ddpify] exclude: pkg?9/
            (sub / name).write_text(SMALL)
            counts["total"] += 1
    (root / ".gitignore").write_text("gen_*.py\n")
    (root / "pyproject.toml").write_text('[tool.ddpify]\nexclude = ["pkg?9/"]\n')
    counts["linted"] = counts["total"] - counts["gitignored"] - counts["excluded"]
    return counts


def test_lint_walks_5000_files_honouring_gitignore_and_exclude(tmp_path):
    """One walk, in json: every file holds one finding, so the files with findings are the files linted."""
    counts = make_tree(tmp_path)
    assert counts["total"] == 5_000
    result = ddpify("lint", ".", "--output-format", "json", cwd=tmp_path)
    no_traceback(result)
    assert result.returncode == 1, result.stderr[-2000:]
    paths = {d["path"] for d in json.loads(result.stdout)}
    assert len(paths) == counts["linted"], (counts, len(paths))
    assert not any("gen_" in p or re.search(r"pkg\d9", p) for p in paths), sorted(paths)[:5]
