"""Measure ddpify on the public corpus: code nobody here wrote (see docs/public-corpus.md).

For every manifest entry (rebuilt first where build/ lacks it, see rebuild.py), each step in a
fresh copy of its own:

  original  the script itself: python, 1 process, the manifest's argv, bounded by a timeout
  convert   `ddpify convert SCRIPT --to ddp --in-place`: exit code, status (as bench/real_corpus.py
            judges it) and ddpify's summary line (or the traceback's last line); for a change, whether
            every changed file compiles and what `ddpify lint` finds in them
  torchrun  where convert exits 0 and wrote a change: `torchrun --standalone --nproc_per_node=2`
            with OMP_NUM_THREADS=1 and the same argv, every process killed at the timeout;
            finished / crashed (the first failed rank's exception line) / hung (each rank's line),
            judged as bench/run_converted.py judges fixtures
  verify    where convert exits 0: `ddpify verify SCRIPT --to ddp --json -- ARGV`, its verdict

Entries of kind "distributed" (already DDP) are converted only: "nothing to do" is the right answer.
Single-GPU entries with "runs": false (hard-coded CUDA, or too slow for a CPU) are converted only too.
Every process sees the shims first on PYTHONPATH (a made-up-data torchvision, and the patches of
shims/ddpify_corpus_site.py), MPLBACKEND=Agg, and the entry's env.

    python bench/public_corpus/run.py [--only NAME ...] [--jobs N] [--json FILE] [--rows FILE] [--merge FILE] [--originals FILE]
                                      [--no-verify] [--timeout S]

--rows appends each entry's row to FILE (a JSON line) as soon as it is measured: a long run cut short
keeps what it measured (--json is written at the end only).

--originals takes the original step from an earlier --json file where it finished there (the scripts,
shims and data do not change with ddpify); the others run again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "bench"))

import rebuild  # noqa: E402
from real_corpus import conversion_status, lint_findings, sources  # noqa: E402
from run_converted import BOOTSTRAP, DUMP_AFTER_VARIABLE, DUMP_AT, NPROC, STACK_DIR_VARIABLE, crash, hung_ranks, run_real  # noqa: E402

from ddpify.verify.diagnose import exception_line  # noqa: E402

SHIMS = HERE / "shims"
TIMEOUT_S = 120.0
VERIFY_TIMEOUT_S = 420.0
FINDING = re.compile(r"^\S+:\d+: ")
STATISTICAL_MODE = "compared in statistical mode"  # in the note where verify says why


@dataclass
class Row:
    name: str
    kind: str = "single"
    original: str = ""  # ok | failed | timeout | - (not run)
    original_detail: str = ""
    convert_exit: int | None = None
    convert: str = ""  # converted | incomplete | nothing | error | incomplete, exit 0 | exit N
    convert_line: str = ""
    traceback: bool = False  # ddpify itself raised (a Python traceback in its output)
    compiles: str = "-"  # yes | the files that do not | - (nothing written)
    lint: str = "-"  # clean | the rule codes found | - (nothing written)
    torchrun: str = "-"  # finished | crashed | hung | - (not run)
    torchrun_detail: str = ""
    verify: str = "-"
    verify_detail: str = ""
    verify_reason: str = ""  # why verify compared in statistical mode (its note), where it did
    capped: bool = False
    runs: bool = True  # false: converted only (the script cannot run here)
    seconds: float = 0.0


def entries(only: list | None = None) -> list[dict]:
    chosen = [e for e in rebuild.manifest()["entries"] if not only or e["name"] in only]
    if only and len(chosen) != len(set(only)):
        known = {e["name"] for e in chosen}
        raise SystemExit(f"not in the manifest: {', '.join(n for n in only if n not in known)}")
    return chosen


def copy(entry: dict, target: Path) -> tuple[Path, str]:
    """A fresh copy of the entry's build folder: (the folder it runs in, the script relative to it)."""
    shutil.copytree(rebuild.BUILD / entry["name"], target, ignore=shutil.ignore_patterns("__pycache__", ".built"))
    script = Path(entry["script"])
    cwd = Path(entry["cwd"]) if "cwd" in entry else script.parent
    return target / cwd, os.path.relpath(script, cwd)


def environment(entry: dict, first: list[str] = (), capped: bool = True) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "MPLBACKEND": "Agg",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("DDPIFY_CORPUS_MAX_STEPS", None)
    env.update({k: v for k, v in entry.get("env", {}).items() if capped or k != "DDPIFY_CORPUS_MAX_STEPS"})
    path = [*first, str(SHIMS), *entry.get("pythonpath", []), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["PATH"] = os.pathsep.join([str(SHIMS / "bin"), os.environ.get("PATH", "")])
    return env


def summary(report: str) -> str:
    """ddpify convert's own status: its lines that are not per-line findings or the launch hint."""
    lines = [line.strip() for line in report.splitlines() if line.strip() and not FINDING.match(line) and not line.startswith("launch:")]
    return " | ".join(lines)[:400]


def measure(entry: dict, work: Path, with_verify: bool, timeout: float, finished_original: bool = False) -> Row:
    row = Row(entry["name"], entry.get("kind", "single"), capped="DDPIFY_CORPUS_MAX_STEPS" in entry.get("env", {}), runs=entry.get("runs", True))
    started = time.perf_counter()
    limit = float(entry.get("timeout", timeout))
    argv = entry.get("argv", [])
    single = row.kind == "single"

    if single and row.runs:
        row.original, row.original_detail = ("ok", "") if finished_original else run_original(entry, work, limit)
    else:
        row.original = "-"

    folder, script = copy(entry, work / "convert")
    before = sources(folder)
    done = run_real([sys.executable, "-m", "ddpify", "convert", script, "--to", "ddp", "--in-place"], folder, environment(entry), 300)
    if done is None:
        row.convert_exit, row.convert, row.convert_line = None, "convert hung", "ddpify convert ran past 300 s"
        return finish(row, started)
    row.convert_exit = done.returncode
    row.convert, changed = conversion_status(done.returncode, before, sources(folder), "ddp")
    row.convert_line = summary(done.stdout + done.stderr)
    row.traceback = "Traceback (most recent call last)" in done.stdout + done.stderr
    if row.traceback:
        row.convert_line = exception_line(done.stderr or done.stdout)
    if changed:
        row.compiles, row.lint = output_checks(folder, changed)
    if not single or not row.runs or done.returncode != 0 or not changed:
        return finish(row, started)

    bootstrap, stacks = work / "bootstrap", work / "stacks"
    bootstrap.mkdir()
    stacks.mkdir()
    (bootstrap / "sitecustomize.py").write_text(BOOTSTRAP + "import ddpify_corpus_site  # noqa: E402,F401\n")
    env = environment(entry, [str(bootstrap)])
    env.update({STACK_DIR_VARIABLE: str(stacks), DUMP_AFTER_VARIABLE: str(limit * DUMP_AT)})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}", script, *argv]
    ran = run_real(command, folder, env, limit)
    ranks = [str(rank) for rank in range(NPROC)]
    if ran is None:
        row.torchrun, row.torchrun_detail = "hung", hung_ranks(stacks, ranks, folder / script)
    elif ran.returncode != 0:
        row.torchrun, row.torchrun_detail = "crashed", f"exit {ran.returncode}: {crash(ran.stderr)}"
    else:
        unfinished = [rank for rank in ranks if not list(stacks.glob(f"rank-{rank}-*.exited"))]
        # a capped run leaves with os._exit (no atexit): exit 0 of every rank is its finish
        if unfinished and not row.capped:
            row.torchrun, row.torchrun_detail = "crashed", f"exit 0, but rank {', '.join(unfinished)} never reached interpreter exit"
        else:
            row.torchrun = "finished"

    if with_verify:
        folder, script = copy(entry, work / "verify")
        command = [sys.executable, "-m", "ddpify", "verify", script, "--to", "ddp", "--json", "--timeout", str(limit),
                   *entry.get("verify_args", []), "--", *argv]
        bound = max(VERIFY_TIMEOUT_S, 2 * limit + 120)
        done = run_real(command, folder, environment(entry, capped=False), bound)
        if done is None:
            row.verify, row.verify_detail = "verify hung", f"ddpify verify ran past {bound:.0f} s"
        else:
            try:
                result = json.loads(done.stdout)
                row.verify, row.verify_detail = result["verdict"], result.get("message", "")
                row.verify_reason = statistical_reason(result)
            except (json.JSONDecodeError, KeyError, TypeError):
                row.verify, row.verify_detail = "no verdict", exception_line(done.stderr or done.stdout)
    return finish(row, started)


def run_original(entry: dict, work: Path, limit: float) -> tuple[str, str]:
    """The script itself, one process: ok | failed | timeout, and why."""
    folder, script = copy(entry, work / "original")
    done = run_real([sys.executable, script, *entry.get("argv", [])], folder, environment(entry), limit)
    if done is None:
        return "timeout", f"still running after {limit:.0f} s"
    if done.returncode != 0:
        return "failed", f"exit {done.returncode}: {exception_line(done.stderr)}"
    return "ok", ""


def output_checks(folder: Path, changed: list[str]) -> tuple[str, str]:
    """(compiles, lint) of the files convert wrote: "yes" or the files that do not compile; "clean" or
    the rule codes `ddpify lint` finds in them."""
    broken = []
    for name in changed:
        try:
            compile((folder / name).read_text(), name, "exec")
        except SyntaxError:
            broken.append(name)
    found = lint_findings(folder, changed)
    return (", ".join(broken) or "yes"), (", ".join(sorted(set(found))) or "clean")


def statistical_reason(result: dict) -> str:
    """verify's note saying why it compared in statistical mode (from which step, and what drew apart), else
    its message where that says it; "" where it compared exactly."""
    message = result.get("message", "")
    if result.get("mode") != "statistical" and "statistical" not in message:
        return ""
    return next((note for note in result.get("notes", []) if STATISTICAL_MODE in note), message)


def finish(row: Row, started: float) -> Row:
    row.seconds = round(time.perf_counter() - started, 1)
    return row


def totals(rows: list[Row]) -> dict[str, int]:
    single = [r for r in rows if r.kind == "single"]
    distributed = [r for r in rows if r.kind != "single"]
    ran = [r for r in single if r.torchrun != "-"]
    return {
        "single-GPU entries": len(single),
        "  of which converted only (cannot run here)": sum(not r.runs for r in single),
        "original runs (exit 0)": sum(r.original == "ok" for r in single),
        "converted, exit 0": sum(r.convert_exit == 0 for r in single),
        "  of which converted (wrap and sampler)": sum(r.convert == "converted" for r in single),
        "  of which nothing to do": sum(r.convert == "nothing" for r in single),
        "  of which changed without wrap and sampler": sum(r.convert == "incomplete, exit 0" for r in single),
        "incomplete, exit 3": sum(r.convert_exit == 3 for r in single),
        "other convert exits": sum(r.convert_exit not in (0, 3) for r in single),
        "  of which with a ddpify traceback": sum(r.traceback for r in single),
        "outputs written": sum(r.compiles != "-" for r in single),
        "  compile": sum(r.compiles == "yes" for r in single),
        "  lint clean": sum(r.lint == "clean" for r in single),
        "torchrun runs": len(ran),
        "  finished": sum(r.torchrun == "finished" for r in ran),
        "  crashed": sum(r.torchrun == "crashed" for r in ran),
        "  hung": sum(r.torchrun == "hung" for r in ran),
        "verify equivalent": sum(r.verify == "equivalent" for r in single),
        "verify other verdicts": sum(r.verify not in ("-", "equivalent") for r in single),
        "already distributed entries": len(distributed),
        "  ddpify says nothing to do (exit 0, no change)": sum(r.convert == "nothing" for r in distributed),
    }


def table(rows: list[Row]) -> str:
    lines = ["| entry | original | convert (exit) | compiles | lint | torchrun 2 ranks | verify |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        kind = " (already distributed)" if r.kind != "single" else "" if r.runs else " (convert only)"
        cap = " (capped)" if r.capped and r.torchrun == "finished" else ""
        lines.append(f"| `{r.name}`{kind} | {r.original} | {r.convert} ({r.convert_exit}) | {r.compiles} | {r.lint} | {r.torchrun}{cap} | {r.verify} |")
    return "\n".join(lines)


def details(rows: list[Row]) -> str:
    out = []
    for r in rows:
        parts = [f"original: {r.original_detail}" if r.original_detail else "",
                 f"convert: {r.convert_line}" if r.convert not in ("converted", "nothing") else "",
                 f"lint: {r.lint}" if r.lint not in ("-", "clean") else "",
                 f"torchrun: {r.torchrun_detail}" if r.torchrun_detail else "",
                 f"verify: {r.verify_detail}" if r.verify not in ("-", "equivalent") else "",
                 f"statistical because: {r.verify_reason}" if r.verify_reason else ""]
        parts = [p for p in parts if p]
        if parts:
            out.append(f"- `{r.name}`: " + "; ".join(parts))
    return "\n".join(out)


def finished_originals(path: str | None) -> set[str]:
    """The entries whose original finished (exit 0) in an earlier --json file."""
    if not path:
        return set()
    return {r["name"] for r in json.loads(Path(path).read_text())["rows"] if r["original"] == "ok"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", metavar="FILE", help="write the rows and totals here")
    parser.add_argument("--rows", metavar="FILE", help="append each row here as a JSON line once it is measured")
    parser.add_argument("--merge", metavar="FILE", help="an earlier --json file: its rows of entries not run now are kept (table and totals over both)")
    parser.add_argument("--originals", metavar="FILE", help="an earlier --json file: where the original finished there, it is not run again")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds for each run (an entry's own timeout wins)")
    options = parser.parse_args()
    chosen = entries(options.only)
    data = rebuild.manifest()
    for entry in chosen:
        rebuild.build(entry, data["repos"])
    started = time.perf_counter()
    finished = finished_originals(options.originals)
    appending = threading.Lock()

    def one(entry: dict) -> Row:
        with tempfile.TemporaryDirectory(prefix=f"public-corpus-{entry['name']}-") as work:
            row = measure(entry, Path(work), not options.no_verify, options.timeout, entry["name"] in finished)
        print(f"{row.name}: original {row.original}, convert {row.convert} ({row.convert_exit}), torchrun {row.torchrun}"
              f" {row.torchrun_detail}, verify {row.verify} [{row.seconds} s]", file=sys.stderr, flush=True)
        if options.rows:
            with appending, open(options.rows, "a") as rows_file:
                rows_file.write(json.dumps(asdict(row)) + "\n")
        return row

    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        rows = list(pool.map(one, chosen))
    if options.merge and Path(options.merge).is_file():
        fresh = {r.name: r for r in rows}
        earlier = {r["name"]: Row(**r) for r in json.loads(Path(options.merge).read_text())["rows"]}
        order = [e["name"] for e in data["entries"]]
        rows = [fresh.get(name) or earlier[name] for name in order if name in fresh or name in earlier]
    print(table(rows))
    print()
    print(details(rows))
    print()
    counted = totals(rows)
    for name, value in counted.items():
        print(f"{name:52} {value}")
    print(f"({time.perf_counter() - started:.0f} s, --jobs {options.jobs}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    if options.json:
        Path(options.json).write_text(json.dumps({"rows": [asdict(r) for r in rows], "totals": counted}, indent=1) + "\n")


if __name__ == "__main__":
    main()
