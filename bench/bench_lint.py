"""Benchmark `ddpify lint` on a generated corpus: files per CPU-second with --jobs 1 and 2; and its
start-up, the wall time of linting one small file (what a pre-commit hook pays per run).

CPU time is user+sys of the `ddpify lint` process and its pool workers
(resource.getrusage(RUSAGE_CHILDREN), which counts every waited-for descendant).

    python bench/bench_lint.py [--count 2200] [--jobs 1 2] [--min-rate 45] [--startup-rounds 5]

Start-up (fixtures/basic_main.py, best of 5, 2 shared cores): 0.48 s at 6c6b0de, 0.27 s at e19841b
(the CLI imports only the command it runs; no command imports libcst.codemod and its matchers).

`--count 1000 --jobs 1` back to back: 129.8 files/CPU-s at 94eb04f, 238.7 at the next commit: a
fix's statement is found by pairing the LibCST parse with the ast block by block, and only its own
expressions get LibCST positions; resolving the positions of the whole module, once per file with
a fixable finding, was most of the time (the findings and their 827 fix edits over this corpus and
fixtures/ are the same, compared as JSON).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_corpus import make_corpus  # noqa: E402


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def lint_once(corpus: Path, jobs: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, exit code) of one `ddpify lint` run over the corpus."""
    cpu_before, wall_before = children_cpu_seconds(), time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "ddpify", "lint", "--jobs", str(jobs), "--output-format", "json", str(corpus)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    if run.returncode not in (0, 1):
        raise SystemExit(f"ddpify lint failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return time.perf_counter() - wall_before, children_cpu_seconds() - cpu_before, run.returncode


def startup_seconds(rounds: int) -> float:
    """The best wall time of `ddpify lint` on one small fixture."""
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "basic_main.py"
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ddpify", "lint", str(fixture)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2200, help="files in the corpus")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--min-rate", type=float, default=0.0, help="exit 1 below this many files per CPU-second")
    parser.add_argument("--startup-rounds", type=int, default=5, help="runs of `ddpify lint` on one file (best one counts)")
    args = parser.parse_args()
    print(f"start-up: {startup_seconds(args.startup_rounds):.2f} s to lint one small file")
    with tempfile.TemporaryDirectory(prefix="ddpify-bench-") as tmp:
        corpus = Path(tmp)
        files = make_corpus(corpus, args.count)
        print(f"corpus: {files} files")
        worst = float("inf")
        for jobs in args.jobs:
            wall, cpu, _ = lint_once(corpus, jobs)
            rate = files / cpu
            worst = min(worst, rate)
            print(f"--jobs {jobs}: {wall:6.2f}s wall, {cpu:6.2f}s CPU, {rate:7.1f} files/CPU-s, {files / wall:7.1f} files/s")
    if worst < args.min_rate:
        raise SystemExit(f"below the target of {args.min_rate} files per CPU-second")


if __name__ == "__main__":
    main()
