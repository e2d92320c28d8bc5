"""Run every fixture's converted output to the end: DDP and FSDP on 2 ranks under torchrun, DP as python.

    python bench/run_converted.py [--targets ddp fsdp dp accelerate] [--only NAME ...] [--jobs N] [--timeout S]

Every fixture (fixtures/*.py, fixtures/fsdp/, fixtures/real/ scripts and project folders,
fixtures/projects/) is converted with each target by ddpify.project_conversion.convert_entry (the entry and
the project modules it imports, as `ddpify convert` and `ddpify verify` do). Each conversion that
completes is written into a copy of its own and launched there with OMP_NUM_THREADS=1: a
`torchrun --standalone --nproc_per_node=2` job for ddp and fsdp, `python script.py` for dp
(DataParallel on CPU wraps without splitting, but the script must still run to its end). Every
launch is bounded by a timeout, after which every process it started is killed, torchrun's
workers included (they run in sessions of their own). One line per run, then the counts:

  finished  exit 0, and every rank (the one process for dp) reached interpreter exit
  crashed   a non-zero exit: the rank and the exception line of its traceback
  hung      still running at the timeout: where each rank was, from a faulthandler dump

The dump and the exit marks come from a sitecustomize on PYTHONPATH (BOOTSTRAP), which every
process of the launch runs at start-up. tests/test_converted_runs.py runs the same launches.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpify.project_conversion import convert_entry  # noqa: E402
from ddpify.verify.diagnose import exception_line, stuck_in  # noqa: E402
from ddpify.verify.reaper import LAUNCH_VARIABLE, kill_launch  # noqa: E402

FIXTURES = ROOT / "fixtures"
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
MAIN_BLOCK = re.compile(r"^if __name__ == [\"']__main__[\"']", re.M)
TARGETS = ("ddp", "fsdp", "dp")
ON_REQUEST = ("accelerate",)  # run with --targets only (tests/test_accelerate.py runs the top-level fixtures)
NPROC = 2
TIMEOUT_S = 120.0
DUMP_AT = 0.6  # the stacks are dumped at this part of the timeout after a process starts (it starts late)
STACK_DIR_VARIABLE = "DDPIFY_RUN_STACK_DIR"
DUMP_AFTER_VARIABLE = "DDPIFY_RUN_DUMP_AFTER_S"
# Every process of a launch runs this at start-up: it dumps its stacks into the stack folder if it
# still runs near the timeout, and marks that it reached interpreter exit (atexit).
BOOTSTRAP = f"""\
import atexit, faulthandler, os
_folder = os.environ.get({STACK_DIR_VARIABLE!r})
if _folder:
    _name = os.path.join(_folder, "rank-%s-%d" % (os.environ.get("RANK", "main"), os.getpid()))
    faulthandler.dump_traceback_later(float(os.environ[{DUMP_AFTER_VARIABLE!r}]), file=open(_name + ".stack", "w"))
    atexit.register(lambda: open(_name + ".exited", "w").close())
"""

Launch = Callable[[list, Path, dict, float], "subprocess.CompletedProcess | None"]  # None: timed out


@dataclass(frozen=True)
class Entry:
    """A fixture: a script, or a project folder (`folder`) with its entry script."""

    name: str
    script: Path
    folder: Path | None = None


@dataclass
class Outcome:
    entry: str
    target: str
    status: str  # finished | crashed | hung | incomplete | nothing | error (the last three: not run)
    detail: str = ""
    seconds: float = 0.0


def entries(only: list | None = None) -> list[Entry]:
    """Every fixture, by name (`basic_main`, `fsdp/tiny_transformer`, `real/vae`, `projects/classic`)."""
    found = [Entry(p.stem, p) for p in FIXTURES.glob("*.py")]
    found += [Entry(f"fsdp/{p.stem}", p) for p in (FIXTURES / "fsdp").glob("*.py")]
    found += [Entry(f"real/{p.stem}", p) for p in (FIXTURES / "real").glob("*.py")]
    for kind in ("real", "projects"):
        found += [Entry(f"{kind}/{d.name}", script, d) for d in (FIXTURES / kind).iterdir() if (script := project_entry(d))]
    return sorted((e for e in found if not only or e.name in only), key=lambda e: e.name)


def project_entry(folder: Path) -> Path | None:
    """A project folder's entry script: its train.py, else its one top-level script with a `__main__` block."""
    if (folder / "train.py").is_file():
        return folder / "train.py"
    mains = [p for p in sorted(folder.glob("*.py")) if MAIN_BLOCK.search(p.read_text())]
    return mains[0] if len(mains) == 1 else None


@lru_cache(maxsize=None)
def conversion(entry: Entry, target: str):
    """(status, the converted texts by path relative to the copy, or why nothing runs)."""
    try:
        converted = convert_entry(entry.script.resolve(), target, {})
    except Exception as error:  # the converter's own crash: reported, not run
        return "error", f"{type(error).__name__}: {error}"
    failed = [job for job in converted.jobs if job.error is not None]
    if failed:
        return "error", f"{failed[0].path.name}: {type(failed[0].error).__name__}: {failed[0].error}"
    missing = [f"line {m.line}: {m.what}" for job in converted.jobs if job.result for m in job.result.missing]
    if missing:
        return "incomplete", missing[0]
    base = (entry.folder or entry.script.parent).resolve()
    texts = {job.path.relative_to(base).as_posix(): job.result.output for job in converted.jobs if job.changed}
    return ("converted", texts) if texts else ("nothing", converted.jobs[0].result.note if converted.jobs else "")


def write_copy(entry: Entry, texts: dict[str, str], work: Path) -> Path:
    """The entry (its whole folder, for a project) copied into `work` with the converted texts in place; its script."""
    if entry.folder is not None:
        shutil.copytree(entry.folder, work, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    for relative, text in texts.items():
        (work / relative).write_text(text)
    return work / entry.script.relative_to(entry.folder or entry.script.parent)


def argv(script: Path, target: str) -> list[str]:
    if target == "dp":
        return [sys.executable, script.name]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}", script.name]


def environment(bootstrap: Path, stacks: Path, timeout: float) -> dict[str, str]:
    """One thread, this checkout's ddpify and the bootstrap importable, stacks dumped before the timeout."""
    path = [str(bootstrap), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "PYTHONPATH": os.pathsep.join(filter(None, path)),
            STACK_DIR_VARIABLE: str(stacks), DUMP_AFTER_VARIABLE: str(timeout * DUMP_AT)}


def run_real(command: list, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess | None:
    """Run `command` as real processes; None when it outlives `timeout`. Every process it started is killed
    at the end, torchrun's workers (in sessions of their own) and anything left behind included (see
    ddpify.verify.reaper.kill_launch). Its output goes to files, not pipes: a survivor that holds them
    cannot stall the read."""
    token = uuid.uuid4().hex
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, cwd=cwd, env={**env, LAUNCH_VARIABLE: token}, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=err, start_new_session=True)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            kill_launch(process.pid, token)
            process.wait()
        return subprocess.CompletedProcess(command, process.returncode, _text(out), _text(err))


def _text(file) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


def run_one(entry: Entry, target: str, work: Path, launch: Launch = run_real, timeout: float = TIMEOUT_S) -> Outcome:
    """Convert `entry` to `target` and, where that completes, run it in `work` and judge how it ended."""
    status, converted = conversion(entry, target)
    if status != "converted":
        return Outcome(entry.name, target, status, converted)
    script = write_copy(entry, converted, work / "run")
    bootstrap, stacks = work / "bootstrap", work / "stacks"
    bootstrap.mkdir()
    stacks.mkdir()
    (bootstrap / "sitecustomize.py").write_text(BOOTSTRAP)
    started = time.perf_counter()
    done = launch(argv(script, target), script.parent, environment(bootstrap, stacks, timeout), timeout)
    seconds = time.perf_counter() - started
    ranks = ["main"] if target == "dp" else [str(rank) for rank in range(NPROC)]
    if done is None:
        return Outcome(entry.name, target, "hung", hung_ranks(stacks, ranks, script), seconds)
    if done.returncode != 0:
        return Outcome(entry.name, target, "crashed", f"exit {done.returncode}: {crash(done.stderr)}", seconds)
    unfinished = [rank for rank in ranks if not list(stacks.glob(f"rank-{rank}-*.exited"))]
    if unfinished:
        return Outcome(entry.name, target, "crashed", f"exit 0, but rank {', '.join(unfinished)} never reached interpreter exit", seconds)
    return Outcome(entry.name, target, "finished", "", seconds)


def crash(stderr: str) -> str:
    """The rank that failed first and the exception line of its traceback (torchrun prefixes each worker's
    lines with `[rankN]:`; its ChildFailedError names the first rank that failed, else the first traceback
    is the first failure's), else of the one process."""
    ranks: dict[str, list[str]] = {}
    first = None
    for text in stderr.splitlines():
        prefixed = RANK_PREFIX.match(text)
        rank = prefixed[1] if prefixed else ""
        ranks.setdefault(rank, []).append(text[prefixed.end():] if prefixed else text)
        if first is None and rank and ranks[rank][-1].startswith("Traceback"):
            first = rank
    failed = re.search(r"^\s*rank\s*: (\d+)", stderr, re.M)
    rank = failed[1] if failed and failed[1] in ranks else first or ""
    error = exception_line("\n".join(ranks.get(rank, ranks.get("", []))))
    return f"rank {rank}: {error}" if rank else error


def hung_ranks(stacks: Path, ranks: list[str], script: Path) -> str:
    """Where each rank was at the timeout: its stack reduced to the call it waits in and the script's line."""
    lines = []
    for rank in ranks:
        dumps = [p for p in stacks.glob(f"rank-{rank}-*.stack") if p.stat().st_size]
        if not dumps:
            lines.append(f"rank {rank}: finished" if list(stacks.glob(f"rank-{rank}-*.exited")) else f"rank {rank}: no stack dump")
            continue
        lines.append(f"rank {rank}: {stuck_in(str(dumps[0]), (str(script.parent),))}")
    return "; ".join(lines)


def run_all(chosen: list[Entry], targets: tuple, jobs: int, launch: Launch = run_real,
            timeout: float = TIMEOUT_S, progress=lambda outcome: None) -> list[Outcome]:
    """Every (entry, target), `jobs` at a time, each in a temporary folder of its own; in entry order."""
    def one(pair):
        with tempfile.TemporaryDirectory(prefix="ddpify-run-") as work:
            outcome = run_one(*pair, Path(work), launch, timeout)
        progress(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, [(entry, target) for entry in chosen for target in targets]))


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    ran = [o for o in outcomes if o.status in ("finished", "crashed", "hung")]
    return {"converted and run": len(ran), **{status: sum(o.status == status for o in ran) for status in ("finished", "crashed", "hung")},
            "not run (incomplete, nothing to do, converter error)": len(outcomes) - len(ran)}


def line(outcome: Outcome) -> str:
    took = f" {outcome.seconds:5.1f} s" if outcome.seconds else ""
    return f"{outcome.entry:36} {outcome.target:5} {outcome.status:10}{took}  {outcome.detail}".rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=TARGETS + ON_REQUEST, default=list(TARGETS))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="fixtures to run (basic_main, real/vae, projects/classic, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="launches at once")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds before a launch counts as hung")
    options = parser.parse_args()
    started = time.perf_counter()
    outcomes = run_all(entries(options.only), tuple(options.targets), options.jobs, run_real, options.timeout,
                       lambda outcome: print(line(outcome), flush=True))
    print()
    for name, value in counts(outcomes).items():
        print(f"{name:56} {value}")
    print(f"({time.perf_counter() - started:.0f} s, --jobs {options.jobs}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
