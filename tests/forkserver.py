"""Fork-based launches for the test suite: `python script.py` and `torchrun --standalone` without
paying for Python, torch and torch._dynamo start-up in every process (seconds of CPU each).

The test process starts this file once (`python forkserver.py`, torch imported, no threads). For
each launch it forks an *agent*: a new session (so a timeout kills the whole group), the caller's
working directory, environment and files for stdout/stderr. A `python script.py` agent runs the
script as `__main__`, as the interpreter would (sys.argv, sys.path[0] = the script's folder,
PYTHONPATH entries and their sitecustomize, normal interpreter exit, Python's, NumPy's and torch's
random generators seeded from the OS). A torchrun agent does what torchrun's agent does on one
node: it serves the rendezvous store, forks one process per rank with
torchrun's variables (ddpify.verify.launcher.rank_environment, the same as `verify` uses), writes
each rank's stdout to `<log dir>/<run>/attempt_0/<rank>/stdout.log` when asked to redirect, stops
the others when one rank fails and exits 1 if any failed. Real torchrun stays in the suite where it
is the subject (tests/test_launch.py, verify's `--launcher torchrun`); DDPIFY_TEST_FORK=0 makes
every launch a real process.

`python -m ddpify ...` runs (tests/test_verify.py) are forked the same way, and the launcher
`ddpify verify` starts (`python -m ddpify.verify.launcher`, which imports torch) is forked from
them instead of started as a new interpreter: the same code, session, log and plan pipe.

Protocol: one JSON request per line on stdin, each with an "id"; replies on the descriptor named in
argv[1], each naming its request's id: the agent's pid, then its exit code. Launches may overlap
(tests/test_verify.py starts three verifies at once).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
import runpy
import select
import subprocess
import types
import weakref
from pathlib import Path
from typing import NoReturn

# Python's collector thresholds while torch & co. import (their growing heap walked less often), restored
# before the first fork so that every launch collects as a fresh interpreter does
INTERPRETER_GC_THRESHOLDS = gc.get_threshold()
gc.set_threshold(10_000, 20, 100)
# The interpreter's own sys.path (standard library, site-packages, .pth entries): what follows a fresh
# interpreter's PYTHONPATH entries, which site.py made absolute (this server's own are left out)
_SERVER_PYTHONPATH = {os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry}
INTERPRETER_PATH = [entry for entry in sys.path[1:] if entry not in _SERVER_PYTHONPATH]

import numpy.random  # noqa: E402  (the test extra's tensorboard requires NumPy)
import torch
import torch._dynamo  # noqa: F401  (every optimizer's construction imports it)
import torch.distributed  # noqa: F401
import torch.distributed.checkpoint.state_dict  # noqa: F401  (what `convert --to fsdp` saves with)
import torch.nn.parallel  # noqa: F401
import torch.utils.data  # noqa: F401
import torch.utils.tensorboard  # noqa: F401  (0.24 CPU-s a process: the fixtures that log import it; no thread)

import accelerate  # noqa: F401  (the test extra installs it: scripts converted --to accelerate import it)

from ddpify.verify import launcher, runner
# what `python -m ddpify convert|lint|verify` imports, so that its forked runs don't import it each time
import ddpify.cli  # noqa: F401
import ddpify.commands.convert  # noqa: F401
import ddpify.commands.lint  # noqa: F401
import ddpify.commands.verify  # noqa: F401
import ddpify.project_conversion  # noqa: F401  (what convert and verify import when they run: the accelerate codemods)
from ddpify.lint.registry import all_rules
from ddpify.verify.launcher import ForkedRun, rank_environment
from ddpify.verify.rendezvous import serve_store

POLL_S = 0.01
FAILURE_GRACE_S = 2.0
MADV_COLLAPSE = 25  # Linux 6.1+: back a range with transparent huge pages now
HUGE_PAGE = 2 << 20
WARM_UP = Path(__file__).resolve().parents[1] / "fixtures" / "basic_main.py"


def run_as_main(argv: list[str], module: str | None = None) -> int:
    """Run `argv[0]` as `python argv[0] argv[1:]` would (with `module`: `python -m module argv[1:]`);
    its exit code."""
    sys.argv = list(argv)
    try:
        if module:
            sys.path[0] = os.getcwd()
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            _run_script(argv[0])
    except SystemExit as stop:
        return _exit_code(stop)
    except BaseException as error:  # what the interpreter prints for an uncaught exception
        error.__traceback__ = _without_server_frames(error.__traceback__)  # the hook prints the error's own
        sys.excepthook(type(error), error, error.__traceback__)
        return 1
    return 0


def _without_server_frames(tb):
    """The traceback from the first frame that is not this file's (the script's own, as Python prints it)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _run_script(script: str) -> None:
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    with open(script, "rb") as source:
        code = compile(source.read(), script, "exec")
    exec(code, main.__dict__)


def _exit_code(stop: SystemExit) -> int:
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


def become_script(argv: list[str], module: str | None = None) -> NoReturn:
    """Run the script, then leave as the interpreter does (threads joined, atexit run, output flushed).

    os._exit, not a return to the interpreter's finalization: the forked process holds copies of
    the server's objects (the rendezvous store of its agent) that must not be destroyed here.
    """
    fresh_random_state()
    run_sitecustomize()
    if module == "ddpify":
        runner.start_launcher = start_forked_launcher
    code = run_as_main(argv, module)
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def fresh_random_state() -> None:
    """Seed Python's, NumPy's and torch's global generators from the OS, as a fresh interpreter's are:
    a fork would otherwise draw the server's numbers, the same in every launch and on every rank."""
    random.seed()
    numpy.random.seed()
    torch.seed()


def take_environment(env: dict[str, str]) -> None:
    """The caller's environment, and sys.path after [0] as an interpreter started in this folder with it has
    it: the PYTHONPATH entries, made absolute against the folder as site.py makes them, then the interpreter's own."""
    os.environ.clear()
    os.environ.update(env)
    entries = [os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[1:] = list(dict.fromkeys(entries + INTERPRETER_PATH))


def run_sitecustomize() -> None:
    """What a fresh interpreter does at start-up: the first sitecustomize.py on PYTHONPATH runs."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        custom = os.path.join(entry, "sitecustomize.py") if entry else ""
        if custom and os.path.exists(custom):
            with open(custom, "rb") as source:
                exec(compile(source.read(), custom, "exec"), {"__name__": "sitecustomize", "__file__": custom})
            return


def redirect(fd: int, path: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> None:
    target = os.open(path, flags, 0o644)
    os.dup2(target, fd)
    os.close(target)


def fork() -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    return os.fork()


def run_ranks(request: dict) -> int:
    """torchrun --standalone on one node: one forked process per rank; 1 if any rank failed."""
    nproc, log_dir = request["nproc"], request.get("log_dir")
    store = serve_store(nproc)
    ranks = [_fork_rank(request["argv"], rank_environment(rank, nproc, store), log_dir) for rank in range(nproc)]
    return 1 if any(_wait_ranks(ranks)) else 0


def _fork_rank(argv: list[str], environment: dict[str, str], log_dir: str | None) -> ForkedRun:
    pid = fork()
    if pid:
        return ForkedRun(pid)
    os.environ.update(environment)
    if log_dir:
        folder = os.path.join(log_dir, "fork", "attempt_0", environment["RANK"])
        os.makedirs(folder, exist_ok=True)
        redirect(1, os.path.join(folder, "stdout.log"))
    become_script(argv)


def _wait_ranks(ranks: list[ForkedRun]) -> list[int]:
    """Every rank's exit code; once one fails, the others get a grace period and are then killed."""
    deadline = float("inf")
    while True:
        codes = [rank.poll() for rank in ranks]
        if None not in codes:
            return codes  # type: ignore[return-value]
        if any(codes) and deadline == float("inf"):
            deadline = time.time() + FAILURE_GRACE_S
        if time.time() > deadline:
            for rank, code in zip(ranks, codes):
                if code is None:
                    os.kill(rank.pid, signal.SIGKILL)
        time.sleep(POLL_S)


def start_agent(request: dict, server_fds: tuple[int, ...]) -> int:
    """Fork the agent of one launch; in the server, its pid (the agent never returns)."""
    pid = fork()
    if pid:
        return pid
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        os.setsid()
        os.chdir(request["cwd"])
        redirect(0, os.devnull, os.O_RDONLY)
        redirect(1, request["stdout"])
        redirect(2, request["stderr"])
        take_environment(request["env"])
        if not request["nproc"]:
            become_script(request["argv"], request.get("module"))
        code = run_ranks(request)
    except BaseException:
        traceback.print_exc()
        code = 70
    sys.stderr.flush()
    os._exit(code)


class ForkedLauncher(ForkedRun):
    """verify's launcher as a forked child, with the Popen surface verify's runner uses."""

    def __init__(self, pid: int, stdin) -> None:
        super().__init__(pid)
        self.stdin = stdin

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("ddpify.verify.launcher", timeout)  # type: ignore[arg-type]
            time.sleep(POLL_S)
        return self.returncode  # type: ignore[return-value]


def start_forked_launcher(workspace: str, device: str) -> ForkedLauncher:
    """What `ddpify verify` starts as `python -m ddpify.verify.launcher`, forked from this process
    (torch imported, no thread running, no tensor math done): its session, folder, log, environment
    and plan pipe are the subprocess's."""
    read, write = os.pipe()
    pid = fork()
    if pid:
        os.close(read)
        return ForkedLauncher(pid, os.fdopen(write, "w"))
    try:
        os.close(write)
        os.setsid()
        os.chdir(workspace)
        os.dup2(read, 0)
        sys.stdin = open(0, closefd=False)
        redirect(1, os.path.join(workspace, "launcher.txt"))
        os.dup2(1, 2)
        take_environment(runner.launcher_environment(device))  # made from the caller's, before it is cleared
        sys.path[0] = os.getcwd()  # `python -m ddpify.verify.launcher` started there
        launcher.main()
    finally:
        os._exit(70)


def warm_up_the_converter() -> None:
    """One conversion, and so one lint of its output, before the heap is frozen: what a process builds the
    first time it converts (LibCST's native parser loaded, compiled patterns, cached rule sets and grammar
    tables) is then built once, not in every forked `python -m ddpify convert|lint|verify`."""
    from ddpify.convert import convert_source

    convert_source(WARM_UP.read_text(encoding="utf-8"), "ddp", path=str(WARM_UP))


def leave_exit_finalizers_to_the_server() -> None:
    """The weakref finalizers imported here (torch.library's, one per op library it registers: ~170) do
    not run again at the exit of every fork, which only ends: each would undo its library's registrations,
    46 ms and 33 MB of copied pages a process on this machine. A script's own finalizers still run."""
    for finalizer in list(weakref.finalize._registry):  # type: ignore[attr-defined]
        finalizer.atexit = False


def back_with_huge_pages() -> None:
    """Collapse the server's anonymous memory (~250 MB once torch is imported) into 2 MB pages.

    A fork copies one page-table entry per 4 KB page and an exit tears them down again: on this machine
    15 ms of system time a process, 3 ms once the memory is in huge pages (~1,600 processes a suite). A
    child that writes still copies only 4 KB: the kernel splits a shared huge page at its first write.
    Where the kernel lacks MADV_COLLAPSE or has transparent huge pages off, madvise fails: nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start, end in _anonymous_regions():
        madvise(start, end - start, MADV_COLLAPSE)


def _anonymous_regions():
    """(start, end) of each writable private anonymous mapping (the heap too), trimmed to whole huge pages."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if fields[1] != "rw-p" or fields[5:] not in ([], ["[heap]"]):
                continue
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            start, end = -(-low // HUGE_PAGE) * HUGE_PAGE, high // HUGE_PAGE * HUGE_PAGE
            if end > start:
                yield start, end


def serve(control: int) -> None:
    """Answer launch requests until stdin closes, several at a time: an agent's end is noticed through
    SIGCHLD, whose wakeup byte ends the wait for the next request."""
    wake, wakeup = os.pipe()
    os.set_blocking(wakeup, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler of its own, so that the signal writes the byte
    signal.set_wakeup_fd(wakeup)
    agents: dict[int, int] = {}  # pid -> request id
    pending = b""
    while True:
        ready = select.select([0, wake], [], [])[0]
        if wake in ready:
            os.read(wake, 4096)
        report_ended(agents, control)
        if 0 in ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                request = json.loads(line)
                pid = start_agent(request, (control, wake, wakeup))
                agents[pid] = request["id"]
                reply(control, {"id": request["id"], "pid": pid})


def report_ended(agents: dict[int, int], control: int) -> None:
    for pid in list(agents):
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            reply(control, {"id": agents.pop(pid), "returncode": os.waitstatus_to_exitcode(status)})


def reply(control: int, message: dict) -> None:
    os.write(control, (json.dumps(message) + "\n").encode())  # one write under PIPE_BUF: whole


if __name__ == "__main__":
    redirect(1, os.devnull)
    # Every object imported so far (torch's) leaves the collector's view: a forked process's first full
    # collection would otherwise walk them all, copying every page it touches
    # (a 2-rank launch of fixtures/basic_main.py converted to DDP: 0.64 CPU-s without this, 0.21 with it).
    all_rules()  # the rules' modules
    warm_up_the_converter()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*INTERPRETER_GC_THRESHOLDS)
    leave_exit_finalizers_to_the_server()
    back_with_huge_pages()
    serve(int(sys.argv[1]))
