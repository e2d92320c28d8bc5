"""The GPU proof behind bench/gpu_proof.sh: convert every fixture, run the outputs on CUDA, write a table.

    python bench/gpu_proof.py OUT.md [--workdir DIR] [--jobs N] [--only NAME ...]

Per fixture (fixtures/*.py), in order, fixtures in parallel:
  convert ddp -> run under torchrun, 1 rank, NCCL -> 2 ranks sharing GPU 0 (gloo on CUDA
  tensors) -> `ddpify verify --device cuda` with 1 rank (NCCL) and 2 ranks (shared GPU) ->
  convert dp -> run the DataParallel output on the one GPU -> `ddpify verify --to dp --device cuda`.
Every run goes through bench/gpu_probe.py, which notes the backend, where the wrapped module
lives, SyncBatchNorm calls, autocast and GradScaler. Fixture-specific checks read those notes:
SyncBatchNorm, fp16 + GradScaler, bf16 autocast, hard-coded `cuda:N`, a model moved inside a
constructor. One extra run shows what a converted script does with 2 ranks on one GPU unaided.

Every step runs under `timeout` in a session of its own; whatever it leaves behind (torchrun
starts its workers in sessions of their own) is found by a tag in its environment and killed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ddpify.exit_codes import EXIT_INCOMPLETE

UNCONVERTED = "the converter left the script unchanged"  # verify's words when there is no candidate to run

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "bench" / "gpu_probe.py"
FIXTURES = sorted(p for p in (ROOT / "fixtures").glob("*.py") if p.is_file())
TAG_ENV = "GPU_PROOF_TAG"
STEP_TIMEOUT_S = 150
VERIFY_TIMEOUT_S = 100
# Divergences that `ddpify verify` also reports on CPU (strict xfails in tests/test_verify.py).
KNOWN_DDP_DIVERGENCES = {"step_based_iter": "converter leaves next(iter(loader)) unsharded (CPU too)"}
HARD_CODED_INDEX = re.compile(r"""["']cuda:\d["']|\.cuda\(\d\)|device\(\s*["']cuda["']\s*,\s*\d""")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
DDPIFY = [sys.executable, "-m", "ddpify"]
DEADLINE = [float("inf")]  # monotonic time after which no step starts (set by --budget)


class OutOfTime(Exception):
    """The proof's time budget ran out before this step started."""


@dataclass
class Row:
    fixture: str
    check: str
    result: str
    seconds: float
    notes: str = ""


@dataclass
class Step:
    returncode: int
    seconds: float
    output: str
    timed_out: bool = False


@dataclass
class Fixture:
    """One fixture's working directory, converted files and collected rows."""
    path: Path
    workdir: Path
    rows: list[Row] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.stem

    def converted(self, target: str) -> Path:
        return self.workdir / f"{self.name}_{target}.py"

    def rundir(self, label: str) -> Path:
        path = self.workdir / label
        path.mkdir(parents=True, exist_ok=True)
        return path

    def add(self, check: str, ok: bool | None, step: Step | None, notes: str, known: str = "") -> bool:
        """A row: pass, FAIL, skipped (ok is None), or known (a failure with a `known` reason)."""
        result = "skipped" if ok is None else "pass" if ok else "known" if known else "FAIL"
        if known and not ok:
            notes = f"{known}: {notes}"
        self.rows.append(Row(self.name, check, result, step.seconds if step else 0.0, notes))
        return bool(ok)


def kill_tagged(tag: str) -> None:
    """SIGKILL every process whose environment carries this step's tag."""
    needle = f"{TAG_ENV}={tag}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue


def run(command: list[str], cwd: Path, timeout: int = STEP_TIMEOUT_S, log: Path | None = None) -> Step:
    """Run `command` under `timeout` in its own session; kill its group and anything tagged afterwards."""
    if time.monotonic() > DEADLINE[0]:
        raise OutOfTime
    tag = uuid.uuid4().hex
    env = dict(os.environ, **{TAG_ENV: tag, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    start = time.monotonic()
    process = subprocess.Popen(["timeout", "-k", "5", str(timeout), *command], cwd=cwd, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    finally:
        kill_tagged(tag)
    seconds = round(time.monotonic() - start, 1)
    if log:
        log.write_text(output)
    return Step(process.returncode, seconds, output, timed_out=process.returncode in (124, 137))


def last_error(step: Step) -> str:
    """The line of the output that says what went wrong, shortened for a table cell."""
    if step.timed_out:
        return "timed out"
    lines = [line.strip() for line in step.output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(Error|Exception|error:|could not run)", line)
              and "ChildFailedError" not in line and not line.startswith("raise ")]
    text = (errors or lines or [f"exit {step.returncode}"])[-1]
    return text[:160].replace("|", "\\|")


def probes(outdir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(outdir.glob("probe-*.json"))]


def describe(facts: list[dict]) -> str:
    """A short summary of what the probes saw, for the notes column."""
    if not facts:
        return "no probe record"
    first = facts[0]
    parts = [f"backend {first['backend']}"] if first["backend"] else []
    for wrapper in first["wrappers"]:
        parts.append(f"{wrapper['kind']} on {','.join(wrapper['param_devices'])} device_ids={wrapper['device_ids']}")
        if wrapper["sync_bn"] or wrapper["plain_bn"]:
            parts.append(f"SyncBN {wrapper['sync_bn']} / plain BN {wrapper['plain_bn']}")
    if first["sync_bn_calls"]:
        parts.append(f"SyncBN forward x{first['sync_bn_calls']}")
    for seen in first["autocast"]:
        parts.append(f"autocast {seen['device']} {seen['dtype'].replace('torch.', '')}"
                     f"{'' if seen['enabled'] else ' (off)'}")
    if first["scaler"]:
        parts.append(f"GradScaler enabled={first['scaler']['enabled']} scale={first['scaler']['scale']}")
    return "; ".join(parts)


def wrapped_on_gpu(facts: list[dict], kind: str) -> bool:
    """Every rank wrapped its model (kind DDP or DP) with its parameters on cuda:0 and device_ids [0]."""
    wrappers = [w for f in facts for w in f["wrappers"] if w["kind"] == kind]
    return bool(wrappers) and len(wrappers) >= len(facts) and all(
        w["param_devices"] == ["cuda:0"] and w["device_ids"] in (["0"], ["cuda:0"]) for w in wrappers)


def probed_run(fixture: Fixture, check: str, label: str, launch: list[str], script: Path, *,
               ranks: int, backend: str | None, wrapper: str, share: bool = False) -> list[dict]:
    """Run `script` through the probe with `launch`, judge it, add a row; returns the probe records."""
    outdir = fixture.rundir(label)
    probe = [str(PROBE), *(["--share-gpu"] if share else []), str(outdir), str(script)]
    step = run([*launch, *probe], cwd=outdir, log=outdir / "log.txt")
    facts = probes(outdir)
    ok = (step.returncode == 0 and "loss" in step.output and len(facts) == ranks
          and all(f["backend"] == backend for f in facts) and wrapped_on_gpu(facts, wrapper))
    notes = describe(facts) if step.returncode == 0 else last_error(step)
    fixture.add(check, ok, step, notes)
    return facts


def convert(fixture: Fixture, target: str) -> bool:
    step = run([*DDPIFY, "convert", str(fixture.path), "--to", target, "-o", str(fixture.converted(target))],
               cwd=fixture.workdir)
    changes = sum(1 for line in step.output.splitlines() if re.match(r".*:\d+: \[", line))
    notes = f"{changes} changes" if step.returncode == 0 else last_error(step)
    known = "unfinished on CPU too (exit 3 says why)" if step.returncode == EXIT_INCOMPLETE else ""
    return fixture.add(f"convert --to {target}", step.returncode == 0, step, notes, known)


def verify(fixture: Fixture, target: str, nproc: int, label: str) -> None:
    command = [*DDPIFY, "verify", str(fixture.path), "--to", target, "--device", "cuda", "--json",
               "--timeout", str(VERIFY_TIMEOUT_S)]
    if target == "ddp":
        command += ["--nproc", str(nproc)]
    step = run(command, cwd=fixture.rundir(label), timeout=VERIFY_TIMEOUT_S + 40)
    try:
        result = json.loads(step.output[step.output.index("{"):])
    except ValueError:
        fixture.add(label.replace("-", " "), False, step, last_error(step))
        return
    notes = result["message"] + "".join(f"; {note}" for note in result["notes"] if "logs kept" not in note)
    known = KNOWN_DDP_DIVERGENCES.get(fixture.name, "") if target == "ddp" and result["verdict"] == "diverged" else ""
    if UNCONVERTED in result["message"]:
        known = "nothing to verify: the conversion is unfinished and changed nothing, on CPU too"
    fixture.add(label.replace("-", " "), result["verdict"] == "equivalent", step, notes[:300], known)


def special_checks(fixture: Fixture, ws1: list[dict], ws2: list[dict]) -> None:
    """The checks one fixture exists for, read off its probe records and its converted text."""
    source = fixture.path.read_text()
    if "BatchNorm" in source:
        for label, facts in (("SyncBatchNorm ws1 nccl", ws1), ("SyncBatchNorm ws2 gloo", ws2)):
            wrappers = [w for f in facts for w in f["wrappers"]]
            ok = bool(wrappers) and all(w["sync_bn"] and not w["plain_bn"] for w in wrappers) and all(
                f["sync_bn_calls"] for f in facts)
            fixture.add(label, ok, None, describe(facts))
    if "GradScaler(" in source:
        seen = ws1[0]["autocast"] if ws1 else []
        scaler = ws1[0]["scaler"] if ws1 else None
        ok = {"device": "cuda", "dtype": "torch.float16", "enabled": True} in seen and bool(scaler and scaler["enabled"])
        fixture.add("AMP fp16 + GradScaler", ok, None, describe(ws1[:1]))
    elif "bfloat16" in source:
        seen = ws1[0]["autocast"] if ws1 else []
        fixture.add("bf16 autocast", {"device": "cuda", "dtype": "torch.bfloat16", "enabled": True} in seen, None,
                    describe(ws1[:1]))
    if HARD_CODED_INDEX.search(source):
        converted = fixture.converted("ddp")
        left = HARD_CODED_INDEX.findall(converted.read_text()) if converted.exists() else ["(not converted)"]
        ok = not left and wrapped_on_gpu(ws1, "DDP")
        fixture.add("hard-coded cuda:N", ok, None, f"left in output: {left}" if left else
                    f"no literal GPU index left; {describe(ws1[:1])}")
    if re.search(r"self\.model\s*=\s*model\.(to|cuda)\(", source):
        fixture.add("model moved in constructor", wrapped_on_gpu(ws1, "DDP") and wrapped_on_gpu(ws2, "DDP"),
                    None, describe(ws1[:1]))


def prove(fixture: Fixture) -> list[Row]:
    """Every check for one fixture, in order; once the budget is spent, the rest is reported as not run."""
    try:
        prove_in_order(fixture)
    except OutOfTime:
        fixture.add("(remaining checks)", None, None, "not run: the time budget ran out")
    return fixture.rows


def prove_in_order(fixture: Fixture) -> None:
    """A failed conversion skips the runs that need it."""
    if convert(fixture, "ddp"):
        ddp = fixture.converted("ddp")
        ws1 = probed_run(fixture, "ddp torchrun ws1 nccl", "ws1", [*TORCHRUN, "--nproc_per_node=1"], ddp,
                         ranks=1, backend="nccl", wrapper="DDP")
        ws2 = probed_run(fixture, "ddp torchrun ws2 gloo 1 GPU", "ws2", [*TORCHRUN, "--nproc_per_node=2"], ddp,
                         ranks=2, backend="gloo", wrapper="DDP", share=True)
        special_checks(fixture, ws1, ws2)
    verify(fixture, "ddp", 1, "verify-ddp-cuda-nproc1")
    verify(fixture, "ddp", 2, "verify-ddp-cuda-nproc2")
    if convert(fixture, "dp"):
        probed_run(fixture, "dp python 1 GPU", "dp", [sys.executable], fixture.converted("dp"),
                   ranks=1, backend=None, wrapper="DP")
    verify(fixture, "dp", 1, "verify-dp-cuda")


def unaided_two_ranks(workdir: Path) -> list[Row]:
    """What a converted script does under `torchrun --nproc_per_node=2` on a one-GPU machine, unaided."""
    fixture = Fixture(ROOT / "fixtures" / "basic_main.py", workdir / "unaided")
    fixture.workdir.mkdir(parents=True)
    run([*DDPIFY, "convert", str(fixture.path), "--to", "ddp", "-o", str(fixture.converted("ddp"))],
        cwd=fixture.workdir)
    outdir = fixture.rundir("ws2-unaided")
    step = run([*TORCHRUN, "--nproc_per_node=2", str(fixture.converted("ddp"))], cwd=outdir,
               log=outdir / "log.txt")
    refusal = re.search(r"rank \d+: LOCAL_RANK .*use torchrun --nproc_per_node=\d+", step.output)
    if step.returncode == 0 or refusal:  # ran, or the converted setup stopped it with the fix in words
        result, notes = "pass", "ran" if step.returncode == 0 else f"stops with the fix: {refusal[0]}"
    else:
        result, notes = "finding", f"rank 1 on a one-GPU machine: {last_error(step)}"
    return [Row("basic_main", "ddp torchrun ws2 unaided 1 GPU", result, step.seconds, notes)]


def header(command: str, wall: float, rows: list[Row]) -> str:
    import torch

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        smi = ""
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "none"
    counts = {r: sum(row.result == r for row in rows) for r in ("pass", "FAIL", "known", "finding", "skipped")}
    return "\n".join([
        "# GPU proof",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- GPU: {smi or 'nvidia-smi gave nothing'} (name, driver, memory)",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, Python {sys.version.split()[0]}",
        f"- command: `{command}`",
        f"- {len(rows)} checks: {counts['pass']} pass, {counts['FAIL']} FAIL, {counts['known']} known, "
        f"{counts['finding']} finding, "
        f"{counts['skipped']} skipped; wall time {wall:.0f} s",
        "- results: pass; FAIL (fails on this GPU); known (`ddpify verify` says the same on CPU); finding "
        "(not a ddpify bug: see notes); skipped (not run)",
        "- ws1/ws2: world size 1 (NCCL) / 2 ranks sharing GPU 0 (gloo on CUDA tensors, as `verify --device cuda` "
        "shares one GPU); every run goes through bench/gpu_probe.py, whose records fill the notes",
        "",
    ])


def table(rows: list[Row]) -> str:
    lines = ["| fixture | check | result | seconds | notes |", "| --- | --- | --- | ---: | --- |"]
    lines += [f"| {r.fixture} | {r.check} | {r.result} | {r.seconds:.1f} | {r.notes} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--only", nargs="*", help="fixture names (stems) to prove; default all")
    parser.add_argument("--budget", type=float, default=480, help="seconds after which no new step starts")
    args = parser.parse_args()
    DEADLINE[0] = time.monotonic() + args.budget
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-proof-")).resolve()
    chosen = [p for p in FIXTURES if not args.only or p.stem in args.only]
    fixtures = [Fixture(p, workdir / p.stem) for p in chosen]
    for fixture in fixtures:
        fixture.workdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        unaided = pool.submit(unaided_two_ranks, workdir)
        rows = [row for rows in pool.map(prove, fixtures) for row in rows] + unaided.result()
    command = " ".join(["bash bench/gpu_proof.sh", *sys.argv[1:]])
    Path(args.out).write_text(header(command, time.monotonic() - start, rows) + "\n" + table(rows))
    print(f"wrote {args.out}: workdir {workdir}")
    return 1 if any(row.result == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
