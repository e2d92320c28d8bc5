"""Convert the real-shaped corpus (fixtures/real/) and check every outcome by running it.

For each entry (a script, or a project folder converted through its train.py entry):
  original  the script itself runs (python, in a temp copy)
  ddp       `ddpify convert --to ddp --in-place` on a copy: exit code and status, one of
            converted (a DDP wrap and sharded data), incomplete (non-zero exit), nothing (no
            change), error (exit 2), or "incomplete, exit 0" (changed without both a wrap and
            sharding, yet exit 0: the silent half-conversion issue 10 forbids)
  torchrun  a converted entry runs under `torchrun --standalone --nproc_per_node=2` (gloo, CPU)
  once      its log lines are printed once: rank 0 prints, rank 1 prints nothing
  lint      `ddpify lint` finds nothing in the converted files
  verify    `ddpify verify --to ddp` (converting the original itself) says equivalent
  dp        `ddpify convert --to dp` outcome, judged the same way (a DataParallel wrap)

    python bench/real_corpus.py [--json] [--only NAME ...] [--no-verify] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from run_converted import run_real  # noqa: E402

CORPUS = ROOT / "fixtures" / "real"
PROJECT_ENTRY = "train.py"
NPROC = 2
RUN_TIMEOUT_S = 120
VERIFY_TIMEOUT_S = 300
# exit codes of `ddpify convert` (issue 10's contract): 0 converted or nothing to do, 2 error,
# 3 incomplete (output written only with --partial)
EXIT_ERROR, EXIT_INCOMPLETE = 2, 3
# the gradients averaged over the ranks: a wrapper, or (DDP) by hand for an optimizer its model owns or tensors
# trained by hand
WRAPS = {"ddp": re.compile(r"\b(DistributedDataParallel|DDP|average_gradients|average_tensor_gradients)\("), "dp": re.compile(r"\bDataParallel\(")}
# the training data split over the ranks: a sampler, (reinforcement learning) an environment per rank,
# or (no DataLoader) each loss's rows shared, or each rank's own draws (a seed plus the rank)
SHARDING = re.compile(r"\bDistributedSampler\(|(\breset\(seed=|\.seed\(|\bmanual_seed\()[^\n]*\+ RANK\b|\bon_(every|any)_rank\(|\b(model_)?loss_of_rank_rows\(")
# torch's gloo backend sometimes aborts a rank at interpreter exit, after the script finished
# and left the process group (see tests/test_ddp_codemod.py); such a run counts as a success.

Invoke = Callable[[list, Path], "tuple[int, str]"]


@dataclass
class Entry:
    """One corpus entry: a script, or a project folder whose entry script is train.py."""

    name: str
    path: Path

    @property
    def is_project(self) -> bool:
        return self.path.is_dir()

    @property
    def script(self) -> str:
        """The entry script, relative to the entry's copy."""
        return PROJECT_ENTRY if self.is_project else self.path.name

    def copy_to(self, parent: Path) -> Path:
        """Copy the entry into `parent`; return the folder the script runs in."""
        if self.is_project:
            target = parent / self.name
            shutil.copytree(self.path, target, ignore=shutil.ignore_patterns("__pycache__"))
            return target
        parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.path, parent / self.path.name)
        return parent


@dataclass
class Conversion:
    exit_code: int
    status: str
    report: str
    changed: list = field(default_factory=list)  # converted files, relative to the entry's copy


@dataclass
class Row:
    name: str
    original: bool = False
    ddp: str = ""
    ddp_exit: int | None = None
    torchrun: bool | None = None
    once: bool | None = None
    lint: bool | None = None
    lint_findings: list = field(default_factory=list)
    verify: str | None = None
    dp: str = ""
    dp_exit: int | None = None
    note: str = ""


def entries(only: list | None = None) -> list:
    """Every corpus entry: top-level scripts and project folders with a train.py, by name."""
    found = [Entry(p.stem, p) for p in CORPUS.glob("*.py")]
    found += [Entry(p.name, p) for p in CORPUS.iterdir() if p.is_dir() and (p / PROJECT_ENTRY).is_file()]
    found.sort(key=lambda e: e.name)
    return [e for e in found if not only or e.name in only]


def environment() -> dict:
    """The child environment: one thread, and this checkout's ddpify importable."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def run(argv: list, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run argv; exit code 124 on timeout. Every process it started is killed at the end, orphans holding
    its output included, and the output is read from files (see run_converted.run_real): a pipe an
    orphan keeps open cannot block the read."""
    done = run_real(argv, cwd, environment(), timeout)
    if done is None:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:.0f} s")
    return done


def ddpify_subprocess(args: list, cwd: Path) -> tuple:
    """`python -m ddpify ARGS` in cwd: (exit code, stdout + stderr)."""
    done = run([sys.executable, "-m", "ddpify", *args], cwd, RUN_TIMEOUT_S)
    return done.returncode, done.stdout + done.stderr


def sources(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*.py"))}


def conversion_status(exit_code: int, before: dict, after: dict, target: str) -> tuple:
    """(status, changed files) of one convert run, judged by its exit code and its output."""
    changed = [name for name, text in after.items() if before.get(name) != text]
    if exit_code == EXIT_ERROR:
        return "error", changed
    if exit_code == EXIT_INCOMPLETE:
        return "incomplete", changed
    if exit_code != 0:
        return f"exit {exit_code}", changed
    if not changed:
        return "nothing", changed
    text = "\n".join(after[name] for name in changed)
    wrapped = bool(WRAPS[target].search(text))
    complete = wrapped and (target == "dp" or bool(SHARDING.search(text)))
    return ("converted" if complete else "incomplete, exit 0"), changed


def convert(entry: Entry, folder: Path, target: str, invoke: Invoke = ddpify_subprocess) -> Conversion:
    """Convert the copy of `entry` in `folder` in place (its entry script) and judge the outcome."""
    before = sources(folder)
    code, report = invoke(["convert", entry.script, "--to", target, "--in-place"], folder)
    status, changed = conversion_status(code, before, sources(folder), target)
    return Conversion(code, status, report, changed)


def rank_stdout(logs: Path) -> dict:
    """Each rank's stdout from torchrun's --log-dir (with --redirects 1)."""
    return {int(p.parent.name): p.read_text() for p in logs.glob("*/attempt_*/*/stdout.log")}


def torchrun(folder: Path, script: str, logs: Path) -> tuple:
    """Run `script` under torchrun with NPROC ranks: (succeeded, rank stdouts, report)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}",
            "--log-dir", str(logs), "--redirects", "1", script]
    done = run(argv, folder, RUN_TIMEOUT_S)
    outputs = rank_stdout(logs)
    succeeded = done.returncode == 0
    return succeeded, outputs, (done.stderr[-6000:] if not succeeded else "")



def over_entries(measure_one, chosen: list, jobs: int, progress) -> list:
    """`measure_one(entry, folder)` for every chosen entry, each in a temporary folder of its own and
    `jobs` at a time, saying `progress(row)` on stderr as each ends; the rows in entry order."""
    def in_temp(entry: Entry):
        with tempfile.TemporaryDirectory(prefix=f"corpus-{entry.name}-") as work:
            row = measure_one(entry, Path(work))
        print(f"{entry.name}: {progress(row)}", file=sys.stderr, flush=True)
        return row

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(in_temp, chosen))


def logs_once(outputs: dict) -> bool:
    """Rank 0 printed its log, the other ranks printed nothing."""
    return bool(outputs.get(0, "").strip()) and all(not outputs.get(r, "") for r in range(1, NPROC))


def lint_findings(folder: Path, files: list) -> list:
    """Rule codes `ddpify lint` reports for the converted files (empty when clean)."""
    code, report = ddpify_subprocess(["lint", *files], folder)
    found = re.findall(r":\d+:\d+: ([A-Z]+\d+)", report)
    return found if code else []


def verify(folder: Path, script: str) -> str:
    """`ddpify verify SCRIPT --to ddp`'s verdict, with its message when it is not equivalent."""
    done = run([sys.executable, "-m", "ddpify", "verify", script, "--to", "ddp", "--json"], folder, VERIFY_TIMEOUT_S)
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        return f"error: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    if result["verdict"] == "equivalent":
        return "equivalent"
    return f"{result['verdict']}: {result['message']}"


def measure(entry: Entry, work: Path, with_verify: bool) -> Row:
    """Every check of one entry, each in its own copy under `work`."""
    row = Row(entry.name)
    original = entry.copy_to(work / "original")
    row.original = run([sys.executable, entry.script], original, RUN_TIMEOUT_S).returncode == 0
    ddp_copy = entry.copy_to(work / "ddp")
    ddp = convert(entry, ddp_copy, "ddp")
    row.ddp, row.ddp_exit = ddp.status, ddp.exit_code
    if ddp.status == "converted":
        row.torchrun, outputs, row.note = torchrun(ddp_copy, entry.script, work / "logs")
        row.once = logs_once(outputs)
        row.lint_findings = lint_findings(ddp_copy, ddp.changed)
        row.lint = not row.lint_findings
        if with_verify:
            row.verify = verify(entry.copy_to(work / "verify"), entry.script)
    dp = convert(entry, entry.copy_to(work / "dp"), "dp")
    row.dp, row.dp_exit = dp.status, dp.exit_code
    return row


def mark(value) -> str:
    return "-" if value is None else "yes" if value is True else "NO" if value is False else str(value)


def table(rows: list) -> str:
    header = f"{'fixture':28} {'orig':4} {'ddp (exit)':24} {'torchrun':8} {'once':4} {'lint':14} {'verify':10} {'dp (exit)':22}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lint = mark(r.lint) if r.lint is not False else "NO " + ",".join(sorted(set(r.lint_findings)))
        verdict = mark(r.verify).split(":")[0]
        lines.append(f"{r.name:28} {mark(r.original):4} {f'{r.ddp} ({r.ddp_exit})':24} {mark(r.torchrun):8} "
                     f"{mark(r.once):4} {lint:14} {verdict:10} {f'{r.dp} ({r.dp_exit})':22}")
    return "\n".join(lines)


def totals(rows: list) -> dict:
    converted = [r for r in rows if r.ddp == "converted"]
    honest = [r for r in rows if r.ddp == "converted" or (r.ddp == "incomplete" and r.ddp_exit)]
    return {
        "entries": len(rows),
        "originals run": sum(r.original for r in rows),
        "ddp converted": len(converted),
        "ddp incomplete, non-zero exit": sum(r.ddp == "incomplete" for r in rows),
        "ddp incomplete, exit 0": sum(r.ddp == "incomplete, exit 0" for r in rows),
        "ddp other (nothing/error)": len(rows) - len(converted) - sum(r.ddp.startswith("incomplete") for r in rows),
        "honest outcome (converted or incomplete with non-zero exit)": len(honest),
        "converted: torchrun ok": sum(bool(r.torchrun) for r in converted),
        "converted: logs once": sum(bool(r.once) for r in converted),
        "converted: lint clean": sum(bool(r.lint) for r in converted),
        "converted: verify equivalent": sum(r.verify == "equivalent" for r in converted),
        "dp converted": sum(r.dp == "converted" for r in rows),
    }


def details(rows: list) -> str:
    """One line per failed check, with what the check said."""
    lines = []
    for r in rows:
        if r.verify and r.verify != "equivalent":
            lines.append(f"{r.name}: verify {r.verify}")
        if r.note:
            lines.append(f"{r.name}: torchrun {first_error(r.note)}")
    return "\n".join(lines)


def first_error(stderr: str) -> str:
    """The first line of a rank's stderr that names an exception, else its last line."""
    lines = stderr.strip().splitlines() or ["no output"]
    return next((line for line in lines if re.search(r"\w+(Error|Exception):", line)), lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object (rows and totals)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="entries to measure (file stem or project folder)")
    parser.add_argument("--no-verify", action="store_true", help="skip `ddpify verify` (the slowest check)")
    parser.add_argument("--jobs", type=int, default=1, help="entries measured at once")
    options = parser.parse_args()
    started = time.perf_counter()

    rows = over_entries(lambda entry, work: measure(entry, work, with_verify=not options.no_verify),
                        entries(options.only), options.jobs, lambda row: row.ddp)
    if options.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "totals": totals(rows)}, indent=1))
        return
    print(table(rows))
    print()
    print(details(rows))
    print()
    for name, value in totals(rows).items():
        print(f"{name:62} {value}")
    print(f"({time.perf_counter() - started:.0f} s, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
