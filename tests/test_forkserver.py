"""The fork server launches scripts as a real interpreter and real torchrun would: each probe runs
both ways and must report the same (argv, working directory, sys.path with a relative PYTHONPATH entry, environment, collector thresholds, exit code,
rank variables, per-rank logs)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers  # noqa: E402
from helpers import run_script  # noqa: E402

HUGE_PAGE = 2 << 20
PROBE = """\
import gc, json, os, sys
report = {"argv": sys.argv, "cwd": os.getcwd(), "path": sys.path, "name": __name__, "gc": gc.get_threshold(),
          "extra": os.environ.get("PROBE_EXTRA"), "file": __file__,
          "ranks": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}}
print(json.dumps(report))
if "--environment" in sys.argv:
    json.dump(dict(os.environ), open(f"env-{os.environ['RANK']}.json", "w"))
if "--fail" in sys.argv and os.environ.get("RANK", "0") == "1":
    raise RuntimeError("rank one fails")
sys.exit(int(sys.argv[sys.argv.index("--code") + 1]) if "--code" in sys.argv else 0)
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    return script


def both_ways(monkeypatch, argv: list[str], cwd: Path) -> tuple:
    """The run forked from the server, then as a real process; `..` first on PYTHONPATH."""
    pythonpath = os.pathsep.join(filter(None, ["..", os.environ.get("PYTHONPATH")]))
    runs = []
    for forked in (True, False):
        monkeypatch.setattr(helpers, "FORK_LAUNCHES", forked)
        runs.append(run_script(argv, cwd, {"PROBE_EXTRA": "yes", "PYTHONPATH": pythonpath}, timeout=120))
    return tuple(runs)


def test_a_python_run_sees_what_a_fresh_interpreter_sees(monkeypatch, probe, tmp_path):
    forked, real = both_ways(monkeypatch, [sys.executable, str(probe), "--code", "3", "x y"], tmp_path)
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout) == (3, real.stdout)
    assert '"extra": "yes"' in real.stdout and '"name": "__main__"' in real.stdout


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(monkeypatch, tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("def f():\n    raise ValueError('boom')\nf()\n")
    forked, real = both_ways(monkeypatch, [sys.executable, str(script)], tmp_path)
    assert forked.returncode == real.returncode == 1
    assert forked.stderr == real.stderr


def test_a_scripts_own_finalizers_run_at_its_exit(monkeypatch, tmp_path):
    """Those the server's imports registered do not (tests/forkserver.py); the script's do, as in a fresh interpreter."""
    script = tmp_path / "finalized.py"
    script.write_text("import weakref\nclass Box:\n    pass\nbox = Box()\nweakref.finalize(box, print, 'finalized at exit')\n")
    forked, real = both_ways(monkeypatch, [sys.executable, str(script)], tmp_path)
    assert forked.stdout == real.stdout == "finalized at exit\n"


def test_torchrun_ranks_get_torchruns_variables_and_log_files(monkeypatch, probe, tmp_path):
    """Each rank's report and log file, and the variables torchrun's workers get (verify's ranks share
    rank_environment), but the error file of torchrun's own @record decorator."""
    outputs, added = [], []
    given = helpers.child_environment()
    for forked in (True, False):
        monkeypatch.setattr(helpers, "FORK_LAUNCHES", forked)
        logs = tmp_path / f"logs-{forked}"
        run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--log-dir",
                          str(logs), "--redirects", "1", str(probe), "--code", "0", "--environment"], tmp_path, timeout=180)
        assert run.returncode == 0, run.stderr[-2000:]
        outputs.append({int(p.parent.name): p.read_text() for p in logs.glob("*/attempt_*/*/stdout.log")})
        ranks = [json.loads((tmp_path / f"env-{rank}.json").read_text()) for rank in (0, 1)]
        added.append([{name: value for name, value in rank.items() if name not in given} for rank in ranks])
    assert outputs[0] == outputs[1] and sorted(outputs[0]) == [0, 1]
    for forked, real in zip(*added):
        real.pop("TORCHELASTIC_ERROR_FILE", None)
        assert forked.keys() == real.keys()
        assert {name: forked[name] for name in forked if "RANK" in name or "SIZE" in name} == \
               {name: real[name] for name in real if "RANK" in name or "SIZE" in name}


def test_a_failing_rank_fails_the_torchrun(monkeypatch, probe, tmp_path):
    for forked in (True, False):
        monkeypatch.setattr(helpers, "FORK_LAUNCHES", forked)
        run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(probe), "--fail"], tmp_path, timeout=180)
        assert run.returncode == 1 and "rank one fails" in run.stderr, (forked, run.stderr[-2000:])


def test_a_run_past_its_timeout_is_killed_with_its_group(monkeypatch, tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text("import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      "print('started', flush=True)\ntime.sleep(60)\n")
    monkeypatch.setattr(helpers, "FORK_LAUNCHES", True)
    with pytest.raises(AssertionError, match="timed out after 1s"):
        run_script([sys.executable, str(script)], tmp_path, timeout=1)
    after = tmp_path / "after.py"
    after.write_text("print('next')\n")
    assert run_script([sys.executable, str(after)], tmp_path).stdout == "next\n"  # the server still serves


MEET = """import os, sys, time
me, other = sys.argv[1:]
open(me, "w").close()
deadline = time.monotonic() + 20
while not os.path.exists(other) and time.monotonic() < deadline:
    time.sleep(0.01)
print("met" if os.path.exists(other) else "alone")
"""


def test_launches_from_two_threads_run_at_the_same_time(monkeypatch, tmp_path):
    """Each script waits for the other's file: launched one after the other, the first would wait alone."""
    script = tmp_path / "meet.py"
    script.write_text(MEET)
    monkeypatch.setattr(helpers, "FORK_LAUNCHES", True)
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda names: run_script([sys.executable, str(script), *names], tmp_path, timeout=60),
                             [("a", "b"), ("b", "a")]))
    assert [(run.returncode, run.stdout) for run in runs] == [(0, "met\n")] * 2, [run.stderr for run in runs]


DRAWS = """import os, random, numpy, torch
with open(f"draws-{os.getpid()}.txt", "w") as out:
    out.write(f"{random.random()} {numpy.random.rand()} {torch.rand(1).item()}")
"""


def test_every_forked_launch_and_rank_draws_its_own_random_numbers(monkeypatch, tmp_path):
    """Python's, NumPy's and torch's generators, seeded from the OS in every launch and every rank
    as a fresh interpreter's are (forks of the server would otherwise all draw its next numbers)."""
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    monkeypatch.setattr(helpers, "FORK_LAUNCHES", True)
    for argv in ([str(script)], [str(script)], ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]):
        assert run_script([sys.executable, *argv], tmp_path, timeout=120).returncode == 0
    draws = [path.read_text().split() for path in tmp_path.glob("draws-*.txt")]
    assert len(draws) == 4
    assert all(len(set(column)) == 4 for column in zip(*draws)), draws


VERIFIED = """\
import os
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

assert os.environ.get("PROBE_EXTRA") == "seen", "the caller's environment did not reach the script"
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
"""


def test_a_forked_verify_hands_the_callers_environment_to_the_scripts_it_runs(monkeypatch, tmp_path):
    """verify's forked launcher took its environment from one it had just cleared: the reference and the
    ranks saw none of the caller's variables (KeyError where a real `ddpify verify` ran)."""
    (tmp_path / "train.py").write_text(VERIFIED)
    monkeypatch.setattr(helpers, "FORK_LAUNCHES", True)
    run = helpers.run_ddpify(["verify", "train.py", "--to", "ddp"], tmp_path, {"PROBE_EXTRA": "seen"}, timeout=180)
    assert run.returncode == 0, helpers.failure_report(run)


def huge_pages_unavailable() -> str | None:
    """Why this machine cannot collapse memory into huge pages now (MADV_COLLAPSE: Linux 6.1+, THP not off,
    a free 2 MB page), or None: it collapses 2 MB of a private anonymous mapping of its own, as the server does."""
    if not sys.platform.startswith("linux"):
        return "huge pages are collapsed on Linux only"
    region = mmap.mmap(-1, 2 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.write(b"x" * len(region))
    start = ctypes.c_char.from_buffer(region)
    aligned = -(-ctypes.addressof(start) // HUGE_PAGE) * HUGE_PAGE
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    failed = madvise(aligned, HUGE_PAGE, 25) != 0  # MADV_COLLAPSE
    reason = os.strerror(ctypes.get_errno()) if failed else None
    del start
    region.close()
    return f"MADV_COLLAPSE fails here ({reason}, kernel {platform.release()})" if failed else None


def test_the_servers_memory_is_in_huge_pages_so_forks_stay_cheap(tmp_path):
    """Most of the server's anonymous memory (torch's ~250 MB) is in 2 MB pages: a fork copies and an
    exit tears down a page-table entry for every 4 KB page otherwise (forkserver.back_with_huge_pages)."""
    if reason := huge_pages_unavailable():
        pytest.skip(reason)
    (tmp_path / "nothing.py").write_text("")
    run_script(helpers.python_argv(tmp_path / "nothing.py"), tmp_path)
    rollup = Path(f"/proc/{helpers.FORK_SERVER._process.pid}/smaps_rollup").read_text()
    kilobytes = {line.split(":")[0]: int(line.split()[1]) for line in rollup.splitlines()[1:]}
    assert kilobytes["AnonHugePages"] > kilobytes["Anonymous"] / 2, rollup
