"""Benchmark `ddpify verify`: wall seconds per verify pair (one reference + its candidate).

Cases: the hand-written DDP port under the fork launcher and under torchrun, the
DataParallel port, and a fixture converted on the fly (when ddpify.convert exists).
CPU seconds are user+sys of verify and everything it started (RUSAGE_CHILDREN).

    python bench/bench_verify.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "verify_cases"
PAIRS = {
    "ddp port, fork launcher": ["train.py", "--to", "ddp", "--against", "train_ddp.py"],
    "ddp port, torchrun launcher": ["train.py", "--to", "ddp", "--against", "train_ddp.py", "--launcher", "torchrun"],
    "dp port": ["train.py", "--to", "dp", "--against", "train_dp.py"],
    "fixture converted to ddp": [str(ROOT / "fixtures" / "basic_main.py"), "--to", "ddp"],
}


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def verify_once(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `ddpify verify` run; exits if the pair is not equivalent."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cpu_before, wall_before = children_cpu_seconds(), time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "ddpify", "verify", *args], cwd=CASES, env=env,
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise SystemExit(f"verify {' '.join(args)} exited {run.returncode}:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return time.perf_counter() - wall_before, children_cpu_seconds() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the median is shown")
    options = parser.parse_args()
    print(f"{'case':30} {'s/pair (median)':>16} {'min':>6} {'cpu s':>6}   ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    for name, args in PAIRS.items():
        runs = [verify_once(args) for _ in range(options.repeat)]
        walls = [wall for wall, _ in runs]
        cpu = statistics.median(cpu for _, cpu in runs)
        print(f"{name:30} {statistics.median(walls):16.1f} {min(walls):6.1f} {cpu:6.1f}")


if __name__ == "__main__":
    main()
