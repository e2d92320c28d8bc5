"""Tests for ddpify.sources: reading, syntax checks, atomic writes and walking user files."""

from __future__ import annotations

import os
import pickle
import random
import select
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpify import python_files, sources
from ddpify.python_files import iter_python_files
from ddpify.sources import Source, SourceError, check_syntax, mentions_torch, read_source, unchanged_since_read, write_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def walked(paths, **kwargs) -> list:
    return list(iter_python_files([str(p) for p in paths], **kwargs))


def relative_files(results, root: Path) -> list[str]:
    return [Path(r).relative_to(root).as_posix() for r in results if isinstance(r, Path)]


# --------------------------------------------------------------------------- SourceError


def test_source_error_formats_path_line_and_message_on_one_line():
    assert str(SourceError("a.py", "bad thing", line=3)) == "a.py:3: bad thing"
    assert str(SourceError("a.py", "bad\nthing")) == "a.py: bad thing"


def test_source_error_survives_pickling():
    err = pickle.loads(pickle.dumps(SourceError("a.py", "boom", line=7)))
    assert (err.path, err.line, err.message, str(err)) == ("a.py", 7, "boom", "a.py:7: boom")


# --------------------------------------------------------------------------- syntax


def test_syntax_error_names_the_line(tmp_path):
    path = write_bytes(tmp_path / "bad.py", b"import torch\n\nx = (1,\ny = 2 +\n")
    with pytest.raises(SourceError) as info:
        check_syntax(read_source(path))
    assert info.value.line is not None
    assert str(info.value).startswith(f"{path}:{info.value.line}: syntax error")
    assert "Python 2" not in str(info.value)


@pytest.mark.parametrize(
    "code, line",
    [
        ('import os\nprint "hello"\n', 2),
        ("try:\n    pass\nexcept ValueError, e:\n    pass\n", 3),
        ("x = 1\ny = `x`\n", 2),
        ('exec "x = 1"\n', 1),
        ("import os\nos.chmod('f', 0777)\n", 2),
        ('raise ValueError, "bad"\n', 1),
        ("import sys\nprint >>sys.stderr, 'x'\n", 2),
    ],
    ids=["print", "except-comma", "backticks", "exec", "octal", "raise-comma", "print-chevron"],
)
def test_python2_code_is_reported_as_python2(tmp_path, code, line):
    path = write_bytes(tmp_path / "old.py", code.encode())
    with pytest.raises(SourceError) as info:
        check_syntax(read_source(path))
    assert "Python 2 syntax is not supported" in str(info.value)
    assert info.value.line == line


def test_valid_python3_passes_syntax_check_without_warnings(tmp_path, recwarn):
    path = write_bytes(tmp_path / "ok.py", b'import re\nprint("hi")\nre.compile("\\d")\n')
    check_syntax(read_source(path))
    assert not recwarn.list


# --------------------------------------------------------------------------- reading


def test_empty_file_reads_fine(tmp_path):
    source = read_source(write_bytes(tmp_path / "empty.py", b""))
    assert (source.text, source.encoding, source.bom) == ("", "utf-8", False)
    assert source.encode(source.text) == b""
    check_syntax(source)


def test_binary_file_is_rejected(tmp_path):
    path = write_bytes(tmp_path / "blob.py", b"\x7fELF\x02\x01\x00\x00binary")
    with pytest.raises(SourceError, match="binary"):
        read_source(path)


def test_non_utf8_bytes_without_cookie_name_the_line(tmp_path):
    path = write_bytes(tmp_path / "latin.py", b"x = 1\ny = 2\nname = 'caf\xe9'\n")
    with pytest.raises(SourceError) as info:
        read_source(path)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path}:3: ")
    assert "\n" not in str(info.value)


def test_non_utf8_byte_on_first_line_names_line_one(tmp_path):
    path = write_bytes(tmp_path / "latin.py", b"# caf\xe9\n")
    with pytest.raises(SourceError) as info:
        read_source(path)
    assert info.value.line == 1


def test_latin1_cookie_round_trips_byte_identically(tmp_path):
    data = b"# -*- coding: latin-1 -*-\nname = 'caf\xe9 \xfc\xdf'\n"
    source = read_source(write_bytes(tmp_path / "latin.py", data))
    assert "café" in source.text
    assert source.encode(source.text) == data
    check_syntax(source)


def test_text_not_encodable_in_the_file_encoding_raises_source_error(tmp_path):
    data = b"# -*- coding: latin-1 -*-\nx = 1\n"
    source = read_source(write_bytes(tmp_path / "latin.py", data))
    with pytest.raises(SourceError) as info:
        source.encode(source.text + "y = '\u2603'\n")
    assert info.value.line == 3


def test_utf8_bom_round_trips(tmp_path):
    data = b"\xef\xbb\xbfimport torch\nprint('\xc3\xa9')\n"
    source = read_source(write_bytes(tmp_path / "bom.py", data))
    assert source.bom and source.encoding == "utf-8"
    assert source.text.startswith("import torch")
    assert source.encode(source.text) == data
    check_syntax(source)


def test_utf16_file_is_rejected_with_a_clear_message(tmp_path):
    path = write_bytes(tmp_path / "u16.py", "x = 1\n".encode("utf-16"))
    with pytest.raises(SourceError, match="UTF-16"):
        read_source(path)


def test_crlf_tabs_trailing_whitespace_and_no_final_newline_round_trip(tmp_path):
    data = b"import torch\r\nif True:\r\n\tx = 1   \r\n\ty = 2\t\nz = 3 \rw = 4"
    source = read_source(write_bytes(tmp_path / "mixed.py", data))
    assert "\r\n" in source.text and "\t" in source.text
    assert source.encode(source.text) == data


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=200))
def test_any_utf8_text_round_trips_byte_identically(tmp_path, text):
    data = text.encode("utf-8")
    source = read_source(write_bytes(tmp_path / "any.py", data))
    assert source.encode(source.text) == data
    assert unchanged_since_read(source)


def test_missing_path_is_a_source_error(tmp_path):
    with pytest.raises(SourceError) as info:
        read_source(tmp_path / "nope.py")
    assert str(info.value) == f"{tmp_path / 'nope.py'}: no such file or directory"


def test_directory_given_as_file_is_a_source_error(tmp_path):
    with pytest.raises(SourceError, match="is a directory"):
        read_source(tmp_path)


def test_unreadable_file_is_a_source_error(tmp_path, monkeypatch):
    path = write_bytes(tmp_path / "secret.py", b"x = 1\n")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(sources, "open", denied, raising=False)
    with pytest.raises(SourceError, match="permission denied"):
        read_source(path)


def test_mode_is_recorded(tmp_path):
    path = write_bytes(tmp_path / "run.py", b"x = 1\n")
    path.chmod(0o750)
    assert read_source(path).mode == 0o750


def test_mentions_torch():
    assert mentions_torch("import torch.nn as nn\n")
    assert mentions_torch("from torch import optim")
    assert not mentions_torch("import numpy as np\n")


# --------------------------------------------------------------------------- change detection


def test_unchanged_since_read_detects_modification(tmp_path):
    path = write_bytes(tmp_path / "train.py", b"x = 1\n")
    source = read_source(path)
    assert unchanged_since_read(source)
    path.write_bytes(b"x = 2\n")
    assert not unchanged_since_read(source)
    path.unlink()
    assert not unchanged_since_read(source)


# --------------------------------------------------------------------------- writing


def test_write_atomic_keeps_mode_bits(tmp_path):
    path = write_bytes(tmp_path / "run.py", b"old\n")
    path.chmod(0o755)
    write_atomic(path, b"new\n")
    assert path.read_bytes() == b"new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert os.listdir(tmp_path) == ["run.py"]


def test_write_atomic_explicit_mode_and_new_file(tmp_path):
    write_atomic(tmp_path / "a.py", b"a\n", mode=0o700)
    assert stat.S_IMODE((tmp_path / "a.py").stat().st_mode) == 0o700
    write_atomic(tmp_path / "b.py", b"b\n")
    assert (tmp_path / "b.py").read_bytes() == b"b\n"
    assert stat.S_IMODE((tmp_path / "b.py").stat().st_mode) != 0o600  # not mkstemp's default


def test_write_atomic_through_symlink_replaces_target_and_keeps_link(tmp_path):
    target = write_bytes(tmp_path / "real.py", b"old\n")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    write_atomic(link, b"new\n")
    assert link.is_symlink()
    assert target.read_bytes() == b"new\n"


def test_write_atomic_failure_leaves_original_and_no_temp_file(tmp_path, monkeypatch):
    original = b"import torch\r\nx = 1\n"
    path = write_bytes(tmp_path / "train.py", original)

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sources.os, "replace", failing_replace)
    with pytest.raises(SourceError, match="no space left"):
        write_atomic(path, b"x" * 100_000)
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["train.py"]


def test_write_atomic_interrupted_mid_write_leaves_no_temp_file(tmp_path, monkeypatch):
    path = write_bytes(tmp_path / "train.py", b"original\n")

    def interrupted_fsync(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(sources.os, "fsync", interrupted_fsync)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, b"new\n")
    assert path.read_bytes() == b"original\n"
    assert os.listdir(tmp_path) == ["train.py"]


_WRITER = textwrap.dedent(
    """
    import sys
    from ddpify.sources import write_atomic
    path, size = sys.argv[1], int(sys.argv[2])
    payloads = (b"A" * size, b"B" * (size + 12345))
    print("ready", flush=True)
    i = 0
    while True:
        write_atomic(path, payloads[i % 2])
        i += 1
    """
)


def test_kill_9_during_write_atomic_leaves_old_or_new_file(tmp_path):
    size = 2_000_000
    payload_a, payload_b = b"A" * size, b"B" * (size + 12345)
    target = write_bytes(tmp_path / "train.py", payload_a)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    rng = random.Random(1234)
    for _ in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(target), str(size)],
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready and proc.stdout.readline() == b"ready\n", "writer did not start"
            time.sleep(rng.uniform(0.02, 0.3))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        data = target.read_bytes()
        assert data in (payload_a, payload_b), f"torn file of {len(data)} bytes"


# --------------------------------------------------------------------------- walking


def test_named_files_are_yielded_as_given(tmp_path):
    script = write_bytes(tmp_path / "build" / "train.txt", b"x = 1\n")
    assert walked([script], exclude=["*.txt"]) == [script]


def test_missing_path_in_walk_is_yielded_not_raised(tmp_path):
    write_bytes(tmp_path / "a.py", b"")
    results = walked([tmp_path / "missing", tmp_path])
    assert isinstance(results[0], SourceError) and "no such file" in str(results[0])
    assert relative_files(results, tmp_path) == ["a.py"]


def test_walk_is_sorted_and_only_python_files(tmp_path):
    for name in ["b.py", "a.py", "nb.ipynb", "notes.txt", "pkg/z.py", "pkg/c.py", "data.pyc"]:
        write_bytes(tmp_path / name, b"")
    assert relative_files(walked([tmp_path]), tmp_path) == [
        "a.py",
        "b.py",
        "nb.ipynb",
        "pkg/c.py",
        "pkg/z.py",
    ]


def test_walk_honours_gitignore_exclude_and_skips_virtualenvs(tmp_path):
    keep = ["train.py", "src/model.py", "src/sub/keep.py", "notebooks/nb.ipynb"]
    drop = [
        "generated.py",  # root .gitignore, file
        "logs/run.py",  # root .gitignore, directory
        "src/sub/local_only.py",  # nested .gitignore
        "src/scratch/tmp.py",  # nested .gitignore, directory relative to src/
        "experiments/old.py",  # exclude pattern
        "src/legacy_v1.py",  # exclude glob
        ".venv/lib/python3.11/site-packages/torch/x.py",
        "myenv/lib/x.py",  # pyvenv.cfg
        "venv/x.py",
        ".git/hooks/x.py",
        "src/__pycache__/model.py",
        "build/lib/x.py",
        "dist/x.py",
        "pkg.egg-info/x.py",
        "node_modules/x.py",
    ]
    for name in keep + drop:
        write_bytes(tmp_path / name, b"import torch\n")
    write_bytes(tmp_path / "myenv" / "pyvenv.cfg", b"home = /usr/bin\n")
    write_bytes(tmp_path / ".gitignore", b"generated.py\nlogs/\n")
    write_bytes(tmp_path / "src" / ".gitignore", b"sub/local_only.py\n/scratch/\n")
    results = walked([tmp_path], exclude=["experiments/", "legacy_*.py"])
    assert not [r for r in results if isinstance(r, SourceError)]
    assert sorted(relative_files(results, tmp_path)) == sorted(keep)

    unfiltered = relative_files(walked([tmp_path], respect_gitignore=False), tmp_path)
    assert "generated.py" in unfiltered and "src/sub/local_only.py" in unfiltered
    assert "myenv/lib/x.py" not in unfiltered


def test_walk_of_a_hidden_or_venv_named_root_still_walks_it(tmp_path):
    write_bytes(tmp_path / ".hidden" / "a.py", b"")
    assert relative_files(walked([tmp_path / ".hidden"]), tmp_path) == [".hidden/a.py"]


def test_symlink_loop_yields_error_and_walk_goes_on(tmp_path):
    write_bytes(tmp_path / "a.py", b"")
    write_bytes(tmp_path / "sub" / "b.py", b"")
    write_bytes(tmp_path / "zzz" / "c.py", b"")
    (tmp_path / "sub" / "loop").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "self").symlink_to(tmp_path / "self")
    results = walked([tmp_path])
    errors = [r for r in results if isinstance(r, SourceError)]
    assert len(errors) == 2
    assert all("symlink loop" in str(e) for e in errors)
    assert relative_files(results, tmp_path) == ["a.py", "sub/b.py", "zzz/c.py"]


def test_directory_symlinks_are_followed_once(tmp_path):
    outside = tmp_path / "outside"
    write_bytes(outside / "shared.py", b"")
    root = tmp_path / "project"
    write_bytes(root / "pkg" / "m.py", b"")
    (root / "link1").symlink_to(outside, target_is_directory=True)
    (root / "link2").symlink_to(outside, target_is_directory=True)
    (root / "alias").symlink_to(root / "pkg", target_is_directory=True)
    results = walked([root, root / "pkg" / "m.py"])
    assert relative_files(results, root) == ["link1/shared.py", "pkg/m.py"]


def test_dangling_symlink_is_skipped_quietly(tmp_path):
    write_bytes(tmp_path / "a.py", b"")
    (tmp_path / ".#a.py").symlink_to(tmp_path / "gone.py")
    assert walked([tmp_path]) == [tmp_path / "a.py"]


def test_unreadable_directory_is_yielded_as_error(tmp_path, monkeypatch):
    write_bytes(tmp_path / "a.py", b"")
    write_bytes(tmp_path / "locked" / "b.py", b"")
    real_scandir = os.scandir

    def scandir(path):
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(python_files.os, "scandir", scandir)
    results = walked([tmp_path])
    assert [str(r) for r in results if isinstance(r, SourceError)] == [
        f"{tmp_path / 'locked'}: cannot read directory: permission denied"
    ]
    assert relative_files(results, tmp_path) == ["a.py"]


def test_directory_without_read_permission(tmp_path):
    write_bytes(tmp_path / "a.py", b"")
    locked = tmp_path / "locked"
    write_bytes(locked / "b.py", b"")
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running with privileges that ignore directory permissions (root?)")
        results = walked([tmp_path])
        errors = [r for r in results if isinstance(r, SourceError)]
        assert len(errors) == 1 and "permission denied" in str(errors[0])
        assert relative_files(results, tmp_path) == ["a.py"]
    finally:
        locked.chmod(0o755)


def test_walk_of_5000_files(tmp_path):
    for d in range(50):
        directory = tmp_path / f"pkg{d:02d}" / "sub"
        directory.mkdir(parents=True)
        for f in range(100):
            (directory / f"m{f:03d}.py").write_bytes(b"import torch\n")
    (tmp_path / ".gitignore").write_bytes(b"*.pyc\nlogs/\n")
    start = time.perf_counter()
    results = walked([tmp_path], exclude=["nothing/"])
    elapsed = time.perf_counter() - start
    print(f"walked 5,000 files in {elapsed:.3f}s")
    assert len(results) == 5000
    assert all(isinstance(r, Path) for r in results)


def test_source_is_frozen():
    source = Source(path="a.py", text="", encoding="utf-8", bom=False, mode=None)
    with pytest.raises(AttributeError):
        source.text = "x"  # type: ignore[misc]
