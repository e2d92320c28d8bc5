"""Shared helpers for tests that run Python scripts in a subprocess.

``run_script`` is imported by several test modules (fixture runs, converted
script runs); keep its signature stable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence, Union

StrPath = Union[str, "os.PathLike[str]"]

#: how much of stderr/stdout to quote in failure messages
TAIL_CHARS = 4000


def _tail(text: str | bytes | None, limit: int = TAIL_CHARS) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return text if len(text) <= limit else "..." + text[-limit:]


def _kill_group(pgid: int) -> None:
    """SIGKILL a whole process group, ignoring one that is already gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_script(
    argv: Sequence[StrPath],
    cwd: StrPath,
    env_extra: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run ``argv`` in ``cwd`` and return the completed process (text output).

    * ``argv`` is used as given, e.g. ``[sys.executable, "train.py", "--epochs", "1"]``.
    * The child gets a copy of this process's environment with
      ``OMP_NUM_THREADS=1`` (so CPU runs are fast and reproducible), then
      ``env_extra`` on top (which may override it).
    * The child runs in its own session / process group; on timeout the whole
      group (including DataLoader workers or torchrun children) is killed and an
      ``AssertionError`` with the tail of stderr is raised.
    * A non-zero exit status is *not* an error here; callers assert on
      ``returncode`` themselves.
    """
    args = [os.fspath(a) for a in argv]
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("PYTHONIOENCODING", "utf-8")
    if env_extra:
        env.update({str(k): str(v) for k, v in env_extra.items()})

    proc = subprocess.Popen(
        args,
        cwd=os.fspath(cwd),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            # something outside the group still holds the pipes; give up on them
            proc.kill()
            stdout, stderr = "", ""
        raise AssertionError(
            f"timed out after {timeout}s: {' '.join(args)} (cwd={cwd})\n"
            f"--- stdout tail ---\n{_tail(stdout)}\n"
            f"--- stderr tail ---\n{_tail(stderr)}"
        ) from None
    except BaseException:
        # KeyboardInterrupt etc.: never leave the child running
        _kill_group(proc.pid)
        proc.wait()
        raise
    # reap anything the script left behind in its group (stray workers)
    _kill_group(proc.pid)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def python_argv(script: StrPath, *args: StrPath) -> list[str]:
    """``[sys.executable, script, *args]`` as strings, for ``run_script``."""
    return [sys.executable, os.fspath(script), *(os.fspath(a) for a in args)]


def failure_report(result: subprocess.CompletedProcess) -> str:
    """A readable message for an assertion on a finished run."""
    return (
        f"exit code {result.returncode}: {' '.join(map(str, result.args))}\n"
        f"--- stdout tail ---\n{_tail(result.stdout)}\n"
        f"--- stderr tail ---\n{_tail(result.stderr)}"
    )


REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES_DIR = REPO_ROOT / "fixtures"

