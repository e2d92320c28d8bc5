"""Where the test processes keep temporary files and compiled code, how they collect garbage and how they
end (nothing here changes what a test checks).

The collector waits for 10,000 new objects instead of 700 (and runs its older generations less often):
importing the test modules (torch, libcst, mcp) made it walk the growing heap again and again
(`pytest --collect-only`: 6.9 -> 5.5 CPU-s a worker). A conversion still raises the thresholds higher
while it runs (tests/test_convert_collections.py sees the difference).

At the end of a full `python -m pytest -n auto` run on 2 cores, after the last test, each worker spent
~1.5 s in pytest's five final garbage collections over its whole heap (libcst trees, torch) and ~2 s
more finalizing its interpreter, while the controller waited for both.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_PROCESS_GC_THRESHOLDS = (10_000, 20, 100)  # below ddpify.collector's in each generation
gc.set_threshold(*TEST_PROCESS_GC_THRESHOLDS)
RAM_FOLDER = "/dev/shm"
RAM_FOLDER_ROOM_BYTES = 4 << 30  # the suite's files peak well below this (it leaves ~1 MB)


def temporary_files_in_ram() -> None:
    """The suite's temporary files (tmp_path, verify's workspaces, the fork server's output files) on a RAM
    filesystem where one has room and TMPDIR names nothing else. The suite creates and deletes tens of
    thousands of files; on this machine's ext4 each new inode's search past recently deleted ones cost
    ~3 % of the run's CPU (`perf`). README's command here: 3 m 12 s and 338 CPU-s twice, against 3 m 28 s-3 m 40 s and
    368-391 CPU-s with the files on disk."""
    if os.environ.get("TMPDIR") or not os.path.isdir(RAM_FOLDER):
        return
    room = os.statvfs(RAM_FOLDER)
    if room.f_bavail * room.f_frsize < RAM_FOLDER_ROOM_BYTES:
        return
    folder = os.path.join(RAM_FOLDER, f"ddpify-tests-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if os.stat(folder).st_uid != os.getuid():  # someone else's: not a place for ours
        return
    os.environ["TMPDIR"] = folder  # the workers and every process the tests start inherit it
    tempfile.tempdir = None  # tempfile reads TMPDIR again


temporary_files_in_ram()


def compiled_code_kept() -> None:
    """Where PYTHONDONTWRITEBYTECODE keeps Python from writing bytecode, the suite's processes write theirs
    to pytest's cache folder (sys.pycache_prefix), never next to the sources. Without it every process the
    suite starts compiles ddpify again (`python -m ddpify lint`: 0.39 -> 0.30 CPU-s with it kept), and every
    worker its test modules with their asserts rewritten (`pytest --collect-only`: 4.5 -> 3.1 CPU-s): ~10
    CPU-s a run. Torch & co. keep theirs where they were installed: the first run links it in."""
    if not sys.flags.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = os.path.join(ROOT, ".pytest_cache", "pycache")
    seed_with_installed_bytecode(prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the workers and every process the tests start inherit this
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


def seed_with_installed_bytecode(prefix: str) -> None:
    """Before the first run with `prefix` (a fresh clone, as in CI), link into it the bytecode that Python's
    and pip's installs compiled (the standard library's, site-packages'): a process with a pycache prefix
    looks for bytecode there only, so without these links the first run's processes compile torch & co.
    again, ~6 CPU-s in each that imports them first (`pytest -n auto tests/test_fixtures_run.py
    tests/test_forkserver.py` in a fresh clone: 27-29 CPU-s without the links, 15-16 with them, 12-13
    in the clone's next run). Linking the ~18,000 files takes ~1 CPU-s; Python checks each against its
    source as it would in place."""
    done = os.path.join(prefix, ".seeded")
    if os.path.exists(done):
        return
    paths = sysconfig.get_paths()
    for root in sorted({paths["stdlib"], paths["purelib"], paths["platlib"]}):
        for folder, _, names in os.walk(root):
            if os.path.basename(folder) == "__pycache__":
                _link_bytecode(folder, os.path.join(prefix, os.path.dirname(folder).lstrip(os.sep)), names)
    with open(done, "w"):
        pass


def _link_bytecode(folder: str, target: str, names: list[str]) -> None:
    """Link the plain (not optimized) bytecode in `folder` into `target`."""
    os.makedirs(target, exist_ok=True)
    suffix = f".{sys.implementation.cache_tag}.pyc"
    for name in names:
        if name.endswith(suffix):
            with contextlib.suppress(FileExistsError):  # linked before
                try:
                    os.link(os.path.join(folder, name), os.path.join(target, name))
                except OSError:  # another filesystem, or hard links not allowed: a symbolic link
                    os.symlink(os.path.join(folder, name), os.path.join(target, name))


compiled_code_kept()


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker
        atexit.register(_leave_without_finalizing)  # registered before the tests' own: runs after them


def pytest_unconfigure(config) -> None:
    """One full collection (finalizers that raise are still reported), then freeze what survives, so that
    pytest's next collections (five in all) look only at objects made since."""
    gc.collect()
    gc.freeze()
    if not hasattr(config, "workerinput"):  # the controller, once every worker is done
        forget_compiled_temporary_files()


def forget_compiled_temporary_files() -> None:
    """Remove the bytecode of modules the tests imported from temporary folders (copies of the repository,
    pip's build environments, projects in tmp_path: ~13 MB a run), which no later run imports again."""
    temporary = tempfile.gettempdir()
    if sys.pycache_prefix and not ROOT.startswith(temporary + os.sep):
        shutil.rmtree(os.path.join(sys.pycache_prefix, temporary.lstrip(os.sep)), ignore_errors=True)


def _leave_without_finalizing() -> None:
    """The last step of an xdist worker's exit, after every other atexit handler (the fork server's close
    included): results are reported and output flushed, so tearing down its objects one by one changes
    nothing but the time the controller waits."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
