"""Count gloo teardown aborts over many 2-rank torchrun runs of a converted script on CPU.

    OMP_NUM_THREADS=1 python bench/bench_teardown.py [--runs 200] [--jobs 1] [--script PATH]

A run aborts when a rank dies in interpreter shutdown with "terminate called without an active
exception" after training finished (torch's gloo worker threads outliving the process group). The
script defaults to the converted snapshot fixtures/expected/ddp/basic_main.py, so the figure is about
the teardown ddpify writes today; GPUs are hidden, so the ranks use gloo. --jobs runs that many
torchruns at once: more load makes the race likelier, which makes a zero count stronger.

Cause (core dump of an aborted rank, torch 2.13 CPU): every backward stashes a contextvars.Context
in thread-local state; each gloo all-reduce work captures it, and the gloo worker thread that drops
the last such work after Python began finalizing needs the GIL, is pthread_exit'ed inside a
noexcept destructor, and std::terminate aborts the rank. torch 2.11 does not stash the Context.
Figures (2-core machine at load 15-23, 2026-11-23): the current teardown, 1 abort in 30 runs;
with dist.barrier() before destroy_process_group, 2 aborts in 58 runs (--jobs 4), so no fix;
torch 2.11 on a 16-core machine, 0 aborts in 200 runs (--jobs 8).
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


def one_run(script: Path, workdir: Path) -> str:
    """'ok', 'abort' (the teardown abort) or 'failed: <last stderr line>' for one torchrun."""
    workdir.mkdir()
    local = workdir / script.name
    shutil.copy(script, local)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
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
    parser.add_argument("--script", type=Path, default=DEFAULT_SCRIPT)
    args = parser.parse_args()
    script = args.script.resolve()
    started = time.perf_counter()
    counts = {"ok": 0, "abort": 0, "failed": 0}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        outcomes = pool.map(lambda i: one_run(script, Path(tmp) / f"run{i:04d}"), range(args.runs))
        for i, outcome in enumerate(outcomes, 1):
            counts[outcome.split(":")[0]] += 1
            if outcome != "ok":
                print(f"run {i}: {outcome}", flush=True)
            if i % 25 == 0:
                print(f"... {i} runs: {counts}", flush=True)
    print(f"{script.name}: runs={args.runs} aborts={counts['abort']} other failures={counts['failed']} "
          f"jobs={args.jobs} torch={_torch_version()} wall={time.perf_counter() - started:.0f} s", flush=True)


def _torch_version() -> str:
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
