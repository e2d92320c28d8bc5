"""Benchmark sharded evaluation: a converted script against a hand-written expert port.

bench/eval_heavy.py (light training, 30,001 evaluation samples) is converted with `--eval shard`
(the default) and `--eval whole`, and run under torchrun with 2 ranks on CPU (gloo,
OMP_NUM_THREADS=1) next to bench/eval_heavy_expert.py. Each run prints one line per epoch with
the metrics, the epoch's wall time and rank 0's CPU time (less sensitive than wall time to other
work on a shared machine); epoch 0 is warm-up and left out. The variants run in turn, repeat after
repeat, so drift in the machine's load hits them alike. Prints each variant's median epoch times,
the converted script's relative to the port's (target: within 5%), and whether their printed
metrics are identical.

    python bench/bench_eval.py [--repeat 3] [--nproc 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "eval_heavy.py"
EXPERT = ROOT / "bench" / "eval_heavy_expert.py"
EPOCH = re.compile(r"^(epoch \d+ val_loss \S+ val_acc \S+) time (\S+) cpu (\S+)$")
TIMEOUT = 600


def convert(mode: str, out_dir: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from ddpify.convert import convert_source

    path = out_dir / f"eval_heavy_{mode}.py"
    path.write_text(convert_source(SCRIPT.read_text(), "ddp", path=str(SCRIPT), eval=mode).output)
    return path


def run(script: Path, nproc: int, cwd: Path) -> tuple[list[str], list[float], list[float]]:
    """(metric lines, wall and CPU seconds of the epochs after the first) of one torchrun launch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script)]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    matches = [m for m in map(EPOCH.match, done.stdout.splitlines()) if m]
    if done.returncode != 0 or not matches:
        sys.exit(f"{script.name} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return [m.group(1) for m in matches], [float(m.group(2)) for m in matches[1:]], [float(m.group(3)) for m in matches[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        variants = {"converted, --eval shard": convert("shard", tmp_dir), "expert port": EXPERT, "converted, --eval whole": convert("whole", tmp_dir)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        metrics: dict[str, list[str]] = {}
        for repeat in range(args.repeat):
            for name, script in variants.items():
                lines, seconds, cpu_seconds = run(script, args.nproc, tmp_dir)
                times[name] += seconds
                cpu[name] += cpu_seconds
                metrics.setdefault(name, lines)
                print(f"repeat {repeat + 1}: {name:24s} epochs {' '.join(f'{s:.3f}' for s in seconds)} s", flush=True)
    print(f"\n{args.nproc} ranks, gloo CPU, {args.repeat} repeats x {len(times['expert port']) // args.repeat} timed epochs")
    for label, figures in (("wall", times), ("rank-0 CPU", cpu)):
        medians = {name: statistics.median(values) for name, values in figures.items()}
        for name, median in medians.items():
            spread = f"{min(figures[name]):.3f}-{max(figures[name]):.3f}"
            print(f"{name:24s} median epoch {label} {median:.3f} s (range {spread}), {median / medians['expert port']:.3f}x the port's")
    same = metrics["converted, --eval shard"] == metrics["expert port"]
    print(f"metrics identical to the port's: {'yes' if same else 'NO'}")
    for shard, expert in zip(metrics["converted, --eval shard"], metrics["expert port"]):
        print(f"  converted: {shard}\n  port:      {expert}" if shard != expert else f"  {shard}")
    print(f"whole-set metrics identical too: {'yes' if metrics['converted, --eval whole'] == metrics['expert port'] else 'NO'}")


if __name__ == "__main__":
    main()
