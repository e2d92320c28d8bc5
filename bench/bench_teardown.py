"""Count gloo teardown aborts over many 2-rank torchrun runs of a converted script on CPU.

    python bench/bench_teardown.py [--runs 200] [--jobs 4] [--gil-switch 0.2] [--script PATH]

A run aborts when a rank dies in interpreter shutdown with "terminate called without an active
exception" after training finished. The script defaults to the converted snapshot
fixtures/expected/ddp/basic_main.py, so the figure is about the teardown ddpify writes today; GPUs
are hidden, so the ranks use gloo. --jobs runs that many torchruns at once, and --gil-switch sets
every rank's sys.setswitchinterval (through a sitecustomize): a gloo worker waiting for the GIL then
waits longer, which widens the race, so a zero count under it is a much stronger figure.

Cause (core dump of an aborted rank, torch 2.13 CPU): every backward stashes a contextvars.Context
in thread-local state, and the gradient all-reduce works DDP launches during backward capture it.
A DDP wrapper sits in reference cycles, so after `main()` returns it (its reducer, its works) lives
on past destroy_process_group and is only collected during interpreter finalization; the gloo
thread that then has to release a captured Context needs the GIL, is pthread_exit'ed inside a
noexcept destructor, and std::terminate aborts the rank. (The group's worker threads outlive
destroy_process_group either way: /proc/self/task still lists its pt_gloo_runloop threads.)

Fix (the generated cleanup_distributed): gc.collect() before destroy_process_group, and `del` of
module-level wrappers before the call, so the wrappers are released while Python still runs. A
barrier before destroy_process_group does not help.

Figures (2-core machine shared with other work, 2026-11-23, torch 2.13.0+cpu, `--jobs 4
--gil-switch 0.2`): the previous teardown (destroy_process_group only), 1 abort in 40 runs (300 s); the current
one, 0 aborts in 200 runs (1295 s). Earlier, without --gil-switch: the previous teardown 1 abort
in 30 runs; with a barrier added, 2 in 58.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCRIPT = ROOT / "fixtures" / "expected" / "ddp" / "basic_main.py"
TEARDOWN_ABORT = "terminate called without an active exception"
TIMEOUT_S = 900


def one_run(script: Path, workdir: Path, site: Path | None) -> str:
    """'ok', 'abort' (the teardown abort) or 'failed: <last stderr line>' for one torchrun."""
    workdir.mkdir()
    local = workdir / script.name
    shutil.copy(script, local)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", local.name]
    try:
        result = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"failed: timed out after {TIMEOUT_S} s"
    if TEARDOWN_ABORT in result.stderr:
        return "abort"
    if result.returncode:
        lines = result.stderr.strip().splitlines() or ["(no stderr)"]
        return f"failed: exit {result.returncode}: {lines[-1]}"
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--gil-switch", type=float, help="seconds for sys.setswitchinterval in every rank (widens the race)")
    parser.add_argument("--script", type=Path, default=DEFAULT_SCRIPT)
    args = parser.parse_args()
    script = args.script.resolve()
    started = time.perf_counter()
    counts = {"ok": 0, "abort": 0, "failed": 0}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        site = _switch_interval_site(Path(tmp), args.gil_switch)
        outcomes = pool.map(lambda i: one_run(script, Path(tmp) / f"run{i:04d}", site), range(args.runs))
        for i, outcome in enumerate(outcomes, 1):
            counts[outcome.split(":")[0]] += 1
            if outcome != "ok":
                print(f"run {i}: {outcome}", flush=True)
            if i % 25 == 0:
                print(f"... {i} runs: {counts}", flush=True)
    print(f"{script.name}: runs={args.runs} aborts={counts['abort']} other failures={counts['failed']} "
          f"jobs={args.jobs} gil_switch={args.gil_switch} torch={_torch_version()} wall={time.perf_counter() - started:.0f} s", flush=True)


def _switch_interval_site(tmp: Path, seconds: float | None) -> Path | None:
    """A folder with a sitecustomize.py that sets the switch interval, for PYTHONPATH (None: leave it)."""
    if seconds is None:
        return None
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.setswitchinterval({seconds!r})\n")
    return site


def _torch_version() -> str:
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
