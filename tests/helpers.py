"""Shared helpers for tests that run Python scripts in a subprocess.

``run_script`` is imported by several test modules (fixture runs, converted
script runs); keep its signature stable.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence, Union

if __name__ != "helpers":  # a second copy of this module would start a second fork server in the same process
    raise ImportError(f"import tests/helpers.py as `helpers`, not as `{__name__}` (see test_gpu.py's import)")

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
    env = child_environment(env_extra)
    launch = fork_launch_request(args) if FORK_LAUNCHES else None
    if launch is not None:
        return FORK_SERVER.run(args, launch, os.fspath(cwd), env, timeout)
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


def child_environment(env_extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with OMP_NUM_THREADS=1 and UTF-8 output, then `env_extra`."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("PYTHONIOENCODING", "utf-8")
    env.update({str(k): str(v) for k, v in (env_extra or {}).items()})
    return env


# ===== fork-based launches (tests/forkserver.py) ================================================
#: DDPIFY_TEST_FORK=0: every launch is a real process (python, torchrun), as a user's would be
FORK_LAUNCHES = os.environ.get("DDPIFY_TEST_FORK", "1") != "0"
_TORCHRUN_FLAGS = {"--standalone": None, "--nproc_per_node": "nproc", "--nproc-per-node": "nproc",
                   "--log-dir": "log_dir", "--log_dir": "log_dir", "--redirects": "redirects"}


def run_ddpify(args: Sequence[StrPath], cwd: StrPath, env_extra: Mapping[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m ddpify ARGS` in `cwd`, forked from the fork server (its verify launcher too) unless
    DDPIFY_TEST_FORK=0."""
    argv = [sys.executable, "-m", "ddpify", *(os.fspath(a) for a in args)]
    if not FORK_LAUNCHES:
        return run_script(argv, cwd, env_extra, timeout)
    launch = {"argv": ["-m", *argv[3:]], "module": "ddpify", "nproc": 0}
    return FORK_SERVER.run(argv, launch, os.fspath(cwd), child_environment(env_extra), timeout)


def fork_launch_request(args: Sequence[str]) -> dict | None:
    """What the fork server must launch for `args`, when it is `python script.py ...` or
    `python -m torch.distributed.run --standalone --nproc_per_node=N [--log-dir D --redirects 1]
    script.py ...`; None for anything else (it runs as a real process)."""
    if len(args) < 2 or args[0] != sys.executable:
        return None
    if args[1].endswith(".py"):
        return {"argv": list(args[1:]), "nproc": 0}
    if args[1:3] != ["-m", "torch.distributed.run"]:
        return None
    options, rest = _torchrun_options(list(args[3:]))
    if options is None or "nproc" not in options or not rest or not rest[0].endswith(".py"):
        return None
    if options.get("redirects", "1") != "1" or "--standalone" not in args[3:]:
        return None
    return {"argv": rest, "nproc": int(options["nproc"]), "log_dir": options.get("log_dir")}


def _torchrun_options(args: list[str]) -> tuple[dict[str, str] | None, list[str]]:
    """torchrun's own options (only those the fork server knows) and the script's argv after them."""
    options: dict[str, str] = {}
    while args and args[0].startswith("--"):
        flag, _, value = args.pop(0).partition("=")
        if flag not in _TORCHRUN_FLAGS:
            return None, args
        name = _TORCHRUN_FLAGS[flag]
        if name is not None:
            options[name] = value or args.pop(0)
    return options, args


class ForkServer:
    """The test process's one fork server (started on first use). Launches from several threads overlap:
    each request carries an id, and a thread hands every reply to the inbox of the launch it names."""

    SCRIPT = Path(__file__).resolve().parent / "forkserver.py"

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._inboxes: dict[int, queue.SimpleQueue] = {}  # the running server's launches
        self._ids = itertools.count()
        self._lock = threading.Lock()  # starting the server and writing a request

    def run(self, args: list[str], launch: dict, cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="ddpify-fork-") as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            request = {**launch, "cwd": cwd, "env": env, "stdout": out, "stderr": err}
            returncode = self._launch(request, timeout, args, cwd, out, err)
            return subprocess.CompletedProcess(args, returncode, _read(out), _read(err))

    def _launch(self, request: dict, timeout: float, args: list[str], cwd: str, out: str, err: str) -> int:
        request_id, inbox = self._send(request)
        try:
            pid = _reply(inbox, 30)["pid"]
            try:
                reply = _reply(inbox, timeout)
            except TimeoutError:
                _kill_group(pid)
                _reply(inbox, 30)
                raise AssertionError(f"timed out after {timeout}s: {' '.join(args)} (cwd={cwd})\n"
                                     f"--- stdout tail ---\n{_tail(_read(out))}\n--- stderr tail ---\n{_tail(_read(err))}") from None
            except BaseException:
                _kill_group(pid)
                self.close()
                raise
        finally:
            self._inboxes.pop(request_id, None)
        _kill_group(pid)  # stray workers the script left in its group
        return reply["returncode"]

    def _send(self, request: dict) -> tuple[int, queue.SimpleQueue]:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            assert self._process is not None and self._process.stdin is not None
            request_id, inbox = next(self._ids), queue.SimpleQueue()
            self._inboxes[request_id] = inbox
            self._process.stdin.write((json.dumps({**request, "id": request_id}) + "\n").encode())
            self._process.stdin.flush()
            return request_id, inbox

    def _start(self) -> None:
        read, write = os.pipe()
        self._process = subprocess.Popen([sys.executable, str(self.SCRIPT), str(write)], stdin=subprocess.PIPE,
                                         pass_fds=(write,), env=child_environment(), start_new_session=True)
        os.close(write)
        self._inboxes = {}
        threading.Thread(target=_deliver, args=(read, self._inboxes), daemon=True).start()

    def close(self) -> None:
        if self._process is not None:
            _kill_group(self._process.pid)
            self._process.wait()
            self._process = None


def _deliver(replies: int, inboxes: dict[int, queue.SimpleQueue]) -> None:
    """Hand each of a server's replies to its launch; when the server is gone, tell the launches still waiting."""
    with os.fdopen(replies, "rb") as stream:
        for line in stream:
            reply = json.loads(line)
            inbox = inboxes.get(reply["id"])
            if inbox is not None:
                inbox.put(reply)
    for inbox in list(inboxes.values()):
        inbox.put(None)


def _reply(inbox: queue.SimpleQueue, timeout: float) -> dict:
    try:
        reply = inbox.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError from None
    if reply is None:
        raise RuntimeError("the test fork server died")
    return reply


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as stream:
        return stream.read()


FORK_SERVER = ForkServer()
atexit.register(FORK_SERVER.close)


def python_argv(script: StrPath, *args: StrPath) -> list[str]:
    """``[sys.executable, script, *args]`` as strings, for ``run_script``."""
    return [sys.executable, os.fspath(script), *(os.fspath(a) for a in args)]


def written_files(cwd: Path) -> list[str]:
    """Files a run left in its cwd (tensorboard event names carry time/host/pid: normalised)."""
    names = [p.relative_to(cwd).as_posix() for p in cwd.rglob("*") if p.is_file()]
    return sorted(re.sub(r"events\.out\.tfevents\..*$", "events.out.tfevents.*", n) for n in names)


def failure_report(result: subprocess.CompletedProcess) -> str:
    """A readable message for an assertion on a finished run."""
    return (
        f"exit code {result.returncode}: {' '.join(map(str, result.args))}\n"
        f"--- stdout tail ---\n{_tail(result.stdout)}\n"
        f"--- stderr tail ---\n{_tail(result.stderr)}"
    )


REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES_DIR = REPO_ROOT / "fixtures"


_CONVERSIONS: dict[tuple[Path, str], object] = {}  # converted_file's, by (path, target)


def converted_file(path: Path, target: str):
    """`convert_source` of the file at `path` (named by its path), once per test process: several test files
    check the same conversions (lint clean, width, no added waits). A test that changes the converter
    (monkeypatch) calls convert_source itself."""
    key = (Path(path), target)
    if key not in _CONVERSIONS:
        from ddpify.convert import convert_source

        _CONVERSIONS[key] = convert_source(Path(path).read_text(encoding="utf-8"), target, path=str(path))
    return _CONVERSIONS[key]


def keep_conversion(path: Path, target: str, result) -> None:
    """Hand converted_file a conversion of the file at `path` that a test made itself, the converter's output
    unchanged (tests/test_codegen.py converts every fixture checking each stage's render: ~5 CPU-s a run less)."""
    _CONVERSIONS.setdefault((Path(path), target), result)


def one_line(code: str) -> str:
    """`code` with every bracket opened one item a line (ddpify.codemods.width) closed again onto one line."""
    closed = re.sub(r",?\n\s*([)\]}])", r"\1", code)
    return re.sub(r",\n\s*", ", ", re.sub(r"([(\[{])\n\s*", r"\1", closed))


def ranks_alike(tmp_path: Path, scripts: Mapping[str, str], saved: str, timeout: float,
                beside: Mapping[str, str] | None = None) -> dict[str, bool]:
    """Each script (by name) run as rl.py on 2 ranks (the files `beside` next to it, by file name), each
    rank saving its state dict to `saved` with `{RANK}` in it: whether the two ranks' tensors are equal, by script name."""
    import torch

    alike = {}
    for name, text in scripts.items():
        (tmp_path / name).mkdir()
        for file, code in {**(beside or {}), "rl.py": text}.items():
            (tmp_path / name / file).write_text(code)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "rl.py"]
        done = run_script(torchrun, tmp_path / name, timeout=timeout)
        assert done.returncode == 0, done.stderr
        ranks = [torch.load(tmp_path / name / saved.format(RANK=rank)) for rank in (0, 1)]
        alike[name] = all(torch.equal(ranks[0][key], ranks[1][key]) for key in ranks[0])
    return alike
