"""Step time of ddpify's conversion against an expert's hand-written port, side by side (issue 26).

For each row, a fixture is converted (`--to ddp`, or `--to fsdp` for the FSDP2 row) and run next to
its expert port (bench/expert/: today's DDP/FSDP2 best practice, the fixture's own model and data
imported) under `torchrun --standalone --nproc_per_node=2` on CPU (gloo, OMP_NUM_THREADS=1). Each
launch gets bench/overhead_timing/sitecustomize.py, which times the interval between two `next()`
calls on a DataLoader iterator in every rank without changing either script: a training step when a
backward ran in it, an evaluation step when none did, in wall time and in the process's CPU time
(its threads', gloo's included: on a machine shared with other work the wall time also holds the
waits for a core, which the CPU time leaves out). Each process's first pass over a loader of each
kind is warm-up and left out; a run's step time is the median of the rest over both ranks.

With --device cuda (a machine with a GPU) the same launches run on CUDA: --nproc 1 is one rank on
NCCL; --nproc 2 --share-gpu puts both ranks on GPU 0 with gloo, as `ddpify verify --device cuda`
shares one GPU (NCCL refuses two ranks on one GPU). Each process also reports its peak CUDA memory
(torch.cuda.max_memory_allocated), and the table gives converted / port of the ranks' largest.

In each round every row runs its converted script and its port back to back, in alternating order,
so drift in the machine's load hits both alike (the torch.compile row runs each once untimed first,
to fill the compile cache). A row's ratio is the median over the rounds of converted / port, with
its range; the table also says whether both printed the same lines. The launches are forked from
the tests' fork server (tests/forkserver.py: torchrun's rank variables and rendezvous, without
paying every process's torch import on 2 busy cores); --torchrun starts the real torchrun.

    python bench/bench_overhead.py [--repeat 5] [--only NAME ...] [--torchrun]
                                   [--device cuda --nproc 1 | --device cuda --nproc 2 --share-gpu] [--budget S]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

sys.path.insert(0, str(ROOT / "tests"))

from ddpify.convert import convert_source  # noqa: E402
from helpers import run_script  # noqa: E402
from run_converted import run_real  # noqa: E402

EXPERT = ROOT / "bench" / "expert"
TIMING = ROOT / "bench" / "overhead_timing"
TIMEOUT_S = 300.0
TRAIN, EVAL = "train", "eval"
WALL, CPU = 1, 2  # where a record holds the wall time and the process CPU time
KINDS = ((TRAIN, WALL), (TRAIN, CPU), (EVAL, WALL), (EVAL, CPU))


@dataclass(frozen=True)
class Row:
    name: str
    fixture: str  # relative to the repository
    target: str
    expert: str  # in bench/expert/
    warm_up: bool = False  # one untimed launch of each variant first (torch.compile fills its cache)


ROWS = (
    Row("cnn-batchnorm", "fixtures/batchnorm_cnn.py", "ddp", "batchnorm_cnn.py"),
    Row("transformer-lm", "fixtures/fsdp/tiny_transformer.py", "ddp", "tiny_lm_ddp.py"),
    Row("gan-two-models", "fixtures/real/shape_gan.py", "ddp", "shape_gan.py"),
    Row("amp-gradscaler", "fixtures/amp_gradscaler.py", "ddp", "amp_gradscaler.py"),
    Row("torch-compile", "bench/overhead_fixtures/compiled_mlp.py", "ddp", "compiled_mlp.py", warm_up=True),
    Row("grad-accumulation", "fixtures/grad_accumulation.py", "ddp", "grad_accumulation.py"),
    Row("sharded-eval", "fixtures/validation_accuracy.py", "ddp", "validation_accuracy.py"),
    Row("fsdp2-transformer", "fixtures/fsdp/tiny_transformer.py", "fsdp", "tiny_lm_fsdp.py"),
)


@dataclass(frozen=True)
class Setup:
    """Where the launches run: CPU (gloo) or CUDA (NCCL, or gloo with every rank on GPU 0 when shared)."""

    device: str = "cpu"
    nproc: int = 2
    share_gpu: bool = False
    real_torchrun: bool = False

    def describe(self) -> str:
        if self.device == "cpu":
            return f"{self.nproc} ranks, gloo on CPU, OMP_NUM_THREADS=1"
        if self.share_gpu:
            return f"{self.nproc} ranks sharing GPU 0, gloo on CUDA tensors"
        return f"{self.nproc} rank{'s' if self.nproc > 1 else ''} on CUDA, NCCL"


@dataclass
class Timings:
    """One variant's median step seconds by (kind, clock) and peak CUDA bytes, round after round, and
    what its first round printed."""

    steps: dict[tuple[str, int], list[float]] = field(default_factory=lambda: {kind: [] for kind in KINDS})
    peak_bytes: list[int] = field(default_factory=list)
    printed: str | None = None


def convert(row: Row, folder: Path) -> Path:
    """The row's fixture converted into `folder`."""
    source = ROOT / row.fixture
    result = convert_source(source.read_text(), row.target, path=str(source))
    if result.missing:
        sys.exit(f"{row.fixture} --to {row.target} is incomplete: {result.missing[0].what}")
    script = folder / f"{row.name}_{row.target}.py"
    script.write_text(result.output)
    return script


def run_forked(argv: list, cwd: Path, env: dict, timeout: float):
    """A torchrun launch through the tests' fork server (tests/forkserver.py); None when it times out."""
    try:
        return run_script(argv, cwd, env, timeout)
    except AssertionError:
        return None


@dataclass
class Launch:
    """One launch's median step seconds by (kind, clock), its ranks' largest peak CUDA bytes, its output."""

    medians: dict[tuple[str, int], float]
    peak_bytes: int | None
    printed: str


def launch(script: Path, work: Path, setup: Setup) -> Launch:
    """Run `script` on the setup's ranks in `work` (real torchrun, or forked)."""
    times = work / "times"
    times.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DDPIFY_BENCH_TIMES": str(times),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TIMING), os.environ.get("PYTHONPATH")]))}
    if setup.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    if setup.share_gpu:
        env["DDPIFY_BENCH_SHARE_GPU"] = "1"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={setup.nproc}", str(script)]
    done = (run_real if setup.real_torchrun else run_forked)(argv, work, env, TIMEOUT_S)
    if done is None or done.returncode != 0:
        detail = "timed out" if done is None else f"exit {done.returncode}:\n{done.stderr[-3000:]}"
        sys.exit(f"{script.name} failed ({detail})")
    dumps = [json.loads(path.read_text()) for path in sorted(times.glob("*.json"))]
    steps = step_seconds([dump["records"] for dump in dumps])
    peaks = [dump["cuda_peak_bytes"] for dump in dumps if dump["cuda_peak_bytes"] is not None]
    return Launch({kind: statistics.median(values) for kind, values in steps.items() if values},
                  max(peaks, default=None), done.stdout)


def step_seconds(processes: list[list[list]]) -> dict[tuple[str, int], list[float]]:
    """Every timed step of every process by (kind, clock), each process's first pass of each kind left out."""
    steps: dict[tuple[str, int], list[float]] = {kind: [] for kind in KINDS}
    for records in processes:
        seen: set[str] = set()
        for passes in iterator_passes(records):
            kind = TRAIN if passes[-1][3] > passes[0][3] else EVAL
            for clock in (WALL, CPU) if kind in seen else ():
                steps[kind, clock] += [later[clock] - earlier[clock] for earlier, later in zip(passes, passes[1:])]
            seen.add(kind)
    return steps


def iterator_passes(records: list[list]) -> list[list[list]]:
    """The (pass, wall, CPU, backwards so far) records grouped by pass over a loader, in the order they started."""
    passes: dict[int, list[list]] = {}
    for record in records:
        passes.setdefault(record[0], []).append(record)
    return [run for run in passes.values() if len(run) > 1]


def measure(rows: list[Row], repeat: int, folder: Path, setup: Setup, budget: float) -> dict[tuple[str, str], Timings]:
    """Up to `repeat` rounds of each row's two variants in alternating order, after the warm-ups; no
    row's pair of launches starts once `budget` seconds have passed since the first round began."""
    variants = {(row.name, "converted"): convert(row, folder) for row in rows}
    variants |= {(row.name, "expert"): EXPERT / row.expert for row in rows}
    results = {key: Timings() for key in variants}
    for row in rows:
        for variant in ("converted", "expert") if row.warm_up else ():
            launch(variants[row.name, variant], folder / "warm-up" / f"{row.name}-{variant}", setup)
    start = time.monotonic()
    for round_ in range(repeat):
        for row in rows:
            if time.monotonic() - start > budget:
                print(f"budget of {budget:.0f} s spent in round {round_ + 1}", flush=True)
                return results
            order = ("converted", "expert") if round_ % 2 == 0 else ("expert", "converted")
            for variant in order:
                done = launch(variants[row.name, variant], folder / f"round{round_}" / f"{row.name}-{variant}", setup)
                record(results[row.name, variant], done)
            print(f"round {round_ + 1}: {row.name}: {summary(results, row.name)}", flush=True)
    return results


def record(timings: Timings, done: Launch) -> None:
    """Add one launch to its variant's rounds."""
    timings.printed = timings.printed or done.printed
    for kind, seconds in done.medians.items():
        timings.steps[kind].append(seconds)
    if done.peak_bytes is not None:
        timings.peak_bytes.append(done.peak_bytes)


def summary(results: dict[tuple[str, str], Timings], name: str) -> str:
    converted, expert = results[name, "converted"].steps, results[name, "expert"].steps
    return ", ".join(f"{kind} {'wall' if clock == WALL else 'CPU'} {statistics.median(converted[kind, clock]) * 1e3:.2f} / "
                     f"{statistics.median(expert[kind, clock]) * 1e3:.2f} ms"
                     for kind, clock in KINDS if converted[kind, clock] and expert[kind, clock])


def ratio_cell(converted: list[float], expert: list[float]) -> str:
    """Median of the per-round ratios converted / port, with their range, and the median step times."""
    if not converted or not expert:
        return "-"
    ratios = [c / e for c, e in zip(converted, expert)]
    return (f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}; "
            f"{statistics.median(converted) * 1e3:.2f} / {statistics.median(expert) * 1e3:.2f} ms)")


def peak_cell(converted: list[int], expert: list[int]) -> str:
    """Peak CUDA memory converted / port (the largest over the rounds), with both in MiB."""
    if not converted or not expert:
        return "-"
    return f"{max(converted) / max(expert):.3f} ({max(converted) / 2**20:.1f} / {max(expert) / 2**20:.1f} MiB)"


def table(rows: list[Row], results: dict[tuple[str, str], Timings], setup: Setup) -> str:
    cuda = setup.device == "cuda"
    lines = [f"{setup.describe()}; each cell: converted / expert port "
             "(median of the rounds' ratios, their range; median step time converted / port)", "",
             "| row | fixture | --to | rounds | train, wall | train, CPU | eval, wall | eval, CPU |"
             + (" peak CUDA memory |" if cuda else "") + " same printed lines |",
             "| --- | --- | --- | ---: | --- | --- | --- | --- |" + (" --- |" if cuda else "") + " --- |"]
    for row in rows:
        converted, expert = results[row.name, "converted"], results[row.name, "expert"]
        cells = [ratio_cell(converted.steps[kind], expert.steps[kind]) for kind in KINDS]
        if cuda:
            cells.append(peak_cell(converted.peak_bytes, expert.peak_bytes))
        rounds = len(expert.steps[TRAIN, WALL])
        same = "-" if not rounds else "yes" if converted.printed == expert.printed else "no"
        lines.append(f"| {row.name} | {row.fixture} | {row.target} | {rounds} | {' | '.join(cells)} | {same} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="row names (default: every row)")
    parser.add_argument("--torchrun", action="store_true", help="launch with the real torchrun, not forked")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per launch")
    parser.add_argument("--share-gpu", action="store_true", help="with --device cuda: every rank on GPU 0, gloo")
    parser.add_argument("--budget", type=float, default=float("inf"), help="seconds after which no launch starts")
    args = parser.parse_args()
    if args.share_gpu and args.device != "cuda":
        parser.error("--share-gpu needs --device cuda")
    setup = Setup(args.device, args.nproc, args.share_gpu, args.torchrun)
    rows = [row for row in ROWS if not args.only or row.name in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(rows, args.repeat, Path(tmp), setup, args.budget)
    print("\n" + table(rows, results, setup))
    for row in rows:
        converted, expert = results[row.name, "converted"].printed, results[row.name, "expert"].printed
        if converted != expert:
            print(f"\n{row.name}: the printed lines differ\n--- converted\n{converted}--- expert port\n{expert}")


if __name__ == "__main__":
    main()
