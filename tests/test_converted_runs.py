"""Every fixture's converted output runs to the end on every rank (issue 23: hangs must not ship).

Each fixture (fixtures/*.py, fixtures/fsdp/, fixtures/real/ scripts and project folders,
fixtures/projects/; see bench/run_converted.py, whose launches these are) is converted with
--to ddp, --to fsdp and --to dp. Every conversion that completes runs in a copy of its own with
OMP_NUM_THREADS=1 and a timeout, after which every process of the launch is killed: ddp and fsdp
as `torchrun --standalone --nproc_per_node=2`, dp as `python script.py` (DataParallel on CPU wraps
without splitting, but the script must still run to its end). It must exit 0 with every rank at
interpreter exit; a crash fails with the rank and its exception line, a hang with each rank's
stack at the timeout (the call it waits in and the script's line). A conversion that does not
complete is skipped with its reason (tests/test_real_corpus.py judges those outcomes).

How the launches run, the cheapest faithful way: a real torchrun launch costs about 8 CPU-s here,
nearly all of it Python, torch and torch._dynamo starting in the agent and both workers (the
fixtures train in well under a second each), so the ~230 launches would take half an hour of CPU,
several times this suite's budget. They go through the tests' fork server (tests/forkserver.py)
instead, which forks the agent and the ranks from a process that imported torch, and takes
torchrun's paths where the script can tell: each rank gets the variables torchrun's workers get
(tests/test_forkserver.py compares them), rendezvous as a client
of a store its agent serves (TORCHELASTIC_USE_AGENT_STORE), runs the script as `__main__` after a
sitecustomize on PYTHONPATH (which dumps the stacks and marks the exit), leaves through atexit, and
a failed rank stops the others. What a fork cannot show is the interpreter's own start and
teardown (a gloo abort while Python finalizes): REAL_TORCHRUN always runs under the real
torchrun (a DDP script's real launch, importing its sibling module, on two nodes, with
tests/test_teardown.py's probe at exit, is tests/test_launch.py's), and
`DDPIFY_TEST_FORK=0 python -m pytest tests/test_converted_runs.py` runs every launch that way
(`python bench/run_converted.py --jobs 2` prints the counts: finished, crashed, hung).
Forked launches that other tests already make through the same fork server (RUN_ELSEWHERE: DDP of
fixtures/*.py and fixtures/real/, DP of fixtures/*.py) are skipped here, naming that test.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import FORK_LAUNCHES, child_environment, python_argv, run_script  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "bench" / "run_converted.py"
_spec = importlib.util.spec_from_file_location("run_converted", BENCH)
bench = sys.modules.setdefault("run_converted", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bench)

# Launches that always run under the real torchrun: a transformer under FSDP. (A DDP script's, which imports its sibling
# module as a project's does and holds its wrapper at exit: tests/test_launch.py's two nodes.)
REAL_TORCHRUN = {("fsdp/tiny_transformer", "fsdp")}
# Launches the suite already makes through the same fork server, not repeated here unless every launch is
# real: {(fixtures folder, target): the test that makes them}.
RUN_ELSEWHERE = {
    (".", "ddp"): "tests/test_ddp_codemod.py::test_runs_under_torchrun_on_two_ranks (its snapshot, which "
                  "test_snapshot keeps equal to this conversion)",
    ("real", "ddp"): "tests/test_real_corpus.py::test_complete_conversion_runs_under_torchrun_and_logs_once",
    (".", "dp"): "tests/test_dp_codemod.py::test_converted_script_runs_like_the_original (its snapshot)",
}
# Conversions that crash or hang because of a codemod bug: {(fixture, target): the bug} (strict xfail).
CODEMOD_BUGS: dict[tuple[str, str], str] = {}  # none today: every complete conversion runs to its end


def run_forked(command: list, cwd: Path, env: dict, timeout: float):
    """A launch through the fork server; None when it outlives `timeout` (its session is killed then)."""
    try:
        return run_script(command, cwd, env, timeout)
    except AssertionError as error:
        if str(error).startswith("timed out after"):
            return None
        raise


def launcher(name: str, target: str):
    return run_forked if FORK_LAUNCHES and (name, target) not in REAL_TORCHRUN else bench.run_real


def folder(name: str) -> str:
    return name.split("/")[0] if "/" in name else "."


def params() -> list:
    found = [(entry, target) for entry in bench.entries() for target in bench.TARGETS]
    unknown = set(CODEMOD_BUGS) - {(entry.name, target) for entry, target in found}
    assert not unknown, f"codemod bugs named for launches that do not exist: {unknown}"
    return [pytest.param(entry, target, id=f"{entry.name}-{target}",
                         marks=[pytest.mark.xfail(strict=True, reason=CODEMOD_BUGS[entry.name, target])]
                         if (entry.name, target) in CODEMOD_BUGS else [])
            for entry, target in found]


def test_every_kind_of_fixture_is_run():
    assert {folder(entry.name) for entry in bench.entries()} == {".", "fsdp", "real", "projects"}
    assert len(bench.entries()) >= 80


@pytest.mark.parametrize("entry, target", params())
def test_converted_fixture_runs_to_the_end_on_every_rank(entry, target, tmp_path):
    if FORK_LAUNCHES and (folder(entry.name), target) in RUN_ELSEWHERE:
        pytest.skip(f"run through the same fork server by {RUN_ELSEWHERE[folder(entry.name), target]}")
    outcome = bench.run_one(entry, target, tmp_path, launcher(entry.name, target))
    if outcome.status in ("incomplete", "nothing"):
        pytest.skip(f"the conversion is {outcome.status}: {outcome.detail}")
    assert outcome.status == "finished", bench.line(outcome)


def a_hung_rank_is_reported_with_its_stack(folder: Path, timeouts_s: tuple[int, ...]) -> None:
    """A launch that outlives its timeout names each rank's stuck line; nothing of it is left running.
    (Run beside verify's hang reports by tests/test_hang_reports.py: each waits out a timeout.)

    The ranks dump their stacks a second after they start (not at bench.DUMP_AT of the timeout), so the
    timeout need only cover torchrun's start-up (its agent imports torch before it starts the ranks:
    longer on a busy machine); a launch that ended before a rank had dumped or exited is tried again with
    the next of `timeouts_s`."""
    script = folder / "hang.py"
    script.write_text("import os, time\nif os.environ['RANK'] == '1':\n    time.sleep(600)\n")
    assert hang_report(script, timeouts_s) == "rank 0: finished; rank 1: at hang.py:3 in <module> `time.sleep(600)`"
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _cwd(pid) == str(folder)]


def hang_report(script: Path, timeouts_s: tuple[int, ...]) -> str:
    """Where each rank of `script` under the real torchrun was when its launch timed out (the first
    launch whose every rank had dumped or exited by then, else the last)."""
    bootstrap = script.parent / "bootstrap"
    bootstrap.mkdir()
    (bootstrap / "sitecustomize.py").write_text(bench.BOOTSTRAP)
    for attempt, timeout in enumerate(timeouts_s):
        stacks = script.parent / f"stacks-{attempt}"
        stacks.mkdir()
        env = {**bench.environment(bootstrap, stacks, timeout), bench.DUMP_AFTER_VARIABLE: "1"}
        assert bench.run_real(bench.argv(script, "ddp"), script.parent, env, timeout) is None
        report = bench.hung_ranks(stacks, ["0", "1"], script)
        if "no stack dump" not in report:
            break
    return report


ESCAPER = """import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open("child.pid", "w").write(str(child.pid))
print("left", flush=True)
"""


def test_a_launch_that_leaves_a_detached_child_holding_its_output_is_reaped_at_once(tmp_path):
    """A script exits, leaving a child in a session of its own that holds its stdout and stderr: the launch
    ends when the script does, with its output, and the child is killed (it was re-parented away)."""
    (tmp_path / "escaper.py").write_text(ESCAPER)
    started = time.monotonic()
    done = bench.run_real(python_argv(tmp_path / "escaper.py"), tmp_path, child_environment(), 60)
    assert time.monotonic() - started < 20
    assert done is not None and done.returncode == 0 and done.stdout == "left\n", done
    assert _ends(int((tmp_path / "child.pid").read_text()))


def _ends(pid: int, within: float = 5.0) -> bool:
    """Is `pid` gone (or a zombie) within `within` seconds?"""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False

def _cwd(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


TORCHRUN_ABORTED_RANK = """about to die
E1126 21:10:51.077000 1742 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 1
Traceback (most recent call last):
  File "torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=====================================================
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 1747)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 1747
=====================================================
"""


def test_a_rank_that_left_no_traceback_is_reported_by_how_it_ended():
    """A rank killed by a signal (a C++ abort at interpreter exit) prints no traceback: torchrun's root cause says how it ended."""
    assert bench.crash(TORCHRUN_ABORTED_RANK) == "rank 1: exit code -6 (SIGABRT), no traceback"


def test_plain_python_runs_report_the_exception_line(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("raise ValueError('first line\\nsecond line')\n")
    done = run_script(python_argv(script), tmp_path)
    assert bench.crash(done.stderr) == "ValueError: first line"
