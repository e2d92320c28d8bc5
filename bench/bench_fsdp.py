"""Every fixture through `convert --to fsdp` on CPU (gloo, 2 ranks): the output runs to the end
under torchrun, its checkpoints have the original's layout (same keys, shapes and dtypes, so they
load into the single-GPU model), and `ddpify verify --to fsdp` says equivalent. Prints one line per
fixture and the totals.   Usage: python bench/bench_fsdp.py [--timeout S] [NAME ...]"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "fixtures").glob("*.py")) + sorted((ROOT / "fixtures" / "fsdp").glob("*.py"))
CHECKPOINTS = (".pt", ".pth", ".ckpt")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:.0f} s")


def layout(obj, where: str = "") -> dict[str, tuple]:
    """Key -> (shape, dtype) of every tensor in a (nested) checkpoint; optimizer state by position."""
    if isinstance(obj, torch.Tensor):
        return {where: (tuple(obj.shape), obj.dtype)}
    if isinstance(obj, dict) and {"state", "param_groups"} <= obj.keys():
        obj = by_position(obj)
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in layout(value, f"{where}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, value in enumerate(obj) for k, v in layout(value, f"{where}[{i}]").items()}
    return {}


def by_position(optimizer_state: dict) -> dict:
    """An optimizer state dict keyed by each parameter's position in its groups, as
    `Optimizer.load_state_dict` matches it: the original keys by id, FSDP's full state by name."""
    order = [key for group in optimizer_state["param_groups"] for key in group["params"]]
    state = {order.index(key): value for key, value in optimizer_state["state"].items()}
    return {**optimizer_state, "state": state}


def checkpoints_match(original: Path, converted: Path) -> str:
    names = sorted(p.name for p in original.iterdir() if p.suffix in CHECKPOINTS)
    if not names:
        return "no checkpoint"
    for name in names:
        if not (converted / name).exists():
            return f"{name} missing"
        if layout(torch.load(original / name, map_location="cpu")) != layout(torch.load(converted / name, map_location="cpu")):
            return f"{name} differs"
    return f"{len(names)} same layout"


def prove(script: Path, timeout: float) -> tuple[str, str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        original, converted, checks = Path(tmp, "original"), Path(tmp, "fsdp"), Path(tmp, "verify")
        for folder in (original, converted, checks):
            folder.mkdir()
        run([sys.executable, str(script)], original, timeout)
        output = converted / f"{script.stem}_fsdp.py"
        run([sys.executable, "-m", "ddpify", "convert", str(script), "--to", "fsdp", "-q", "--partial", "-o", str(output)], converted, timeout)
        ranks = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", output.name], converted, timeout)
        ran = "ok" if ranks.returncode == 0 else "FAIL " + (ranks.stderr.strip().splitlines() or ["?"])[-1][:80]
        saved = checkpoints_match(original, converted) if ranks.returncode == 0 else "-"
        verdict = run([sys.executable, "-m", "ddpify", "verify", str(script), "--to", "fsdp", "--json"], checks, timeout)
        message = json.loads(verdict.stdout)["message"] if verdict.stdout.strip() else verdict.stderr.strip()[-80:]
    return ran, saved, message


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="fixture stems (default: all)")
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args()
    scripts = [s for s in FIXTURES if not args.names or s.stem in args.names]
    totals = {"ran": 0, "checkpoints": 0, "equivalent": 0}
    for script in scripts:
        start = time.perf_counter()
        ran, saved, verdict = prove(script, args.timeout)
        totals["ran"] += ran == "ok"
        totals["checkpoints"] += saved.endswith("same layout") or saved == "no checkpoint"
        totals["equivalent"] += verdict.startswith("equivalent")
        print(f"{script.stem:32} {time.perf_counter() - start:6.1f} s  torchrun {ran:4}  checkpoints {saved:16}  {verdict[:90]}", flush=True)
    n = len(scripts)
    print(f"{n} fixtures --to fsdp: {totals['ran']}/{n} run to the end on 2 ranks, {totals['checkpoints']}/{n} checkpoints "
          f"load into the original layout (or none saved), {totals['equivalent']}/{n} verify equivalent")


if __name__ == "__main__":
    main()
