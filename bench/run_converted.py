"""Run every fixture's converted output to the end: DDP and FSDP on 2 ranks under torchrun, DP as python.

    python bench/run_converted.py [--targets ddp fsdp dp accelerate] [--only NAME ...] [--jobs N] [--timeout S]
                                  [--verify [--steps K]] [--json FILE]

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

--verify runs `ddpify verify FIXTURE --to TARGET --steps K` instead (on a copy of the original:
verify converts it itself) for every conversion that completes, bounded by --timeout (default
VERIFY_TIMEOUT_S) and killed like a launch, and prints the verdicts (equivalent, diverged,
not_converted, error, or timeout), then per target: complete conversions of all fixtures, and
how many of them verify equivalent. --json FILE writes every line and the counts.
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
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpify.project_conversion import convert_entry  # noqa: E402
from ddpify.verify.diagnose import exception_line, stuck_in  # noqa: E402
from ddpify.verify.reaper import LAUNCH_VARIABLE, kill_launch  # noqa: E402

FIXTURES = ROOT / "fixtures"
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
ROOT_CAUSE = re.compile(r"^\s*rank\s*: (\d+).*?^\s*exitcode\s*: (-?\d+)[^\n(]*(?:\(pid: \d+\))?\s*(\(SIG\w+\))?", re.M | re.S)
MAIN_BLOCK = re.compile(r"^if __name__ == [\"']__main__[\"']", re.M)
TARGETS = ("ddp", "fsdp", "dp")
ON_REQUEST = ("accelerate",)  # run with --targets only (tests/test_accelerate.py runs the top-level fixtures)
NPROC = 2
TIMEOUT_S = 120.0
VERIFY_TIMEOUT_S = 300.0  # a verify runs the original and the conversion, each importing torch
VERIFY_STEPS = 4
VERDICTS = ("equivalent", "diverged", "not_converted", "error", "timeout")
DUMP_AT = 0.6  # the stacks are dumped at this part of the timeout after a process starts (it starts late)
STACK_DIR_VARIABLE = "DDPIFY_RUN_STACK_DIR"
DUMP_AFTER_VARIABLE = "DDPIFY_RUN_DUMP_AFTER_S"
# Every process of a launch but torchrun's own agent runs this at start-up: it dumps its stacks into the
# stack folder if it still runs near the timeout, and marks that it reached interpreter exit (atexit).
# The agent is left out: nothing reads its stack, and a dump that lands while it starts its threads can
# kill it with SIGSEGV (a launch that ended in 1.5 s with exit -11 about every other time).
BOOTSTRAP = f"""\
import atexit, faulthandler, os, sys
_folder = os.environ.get({STACK_DIR_VARIABLE!r})
_agent = "torch.distributed.run" in sys.orig_argv or "torchrun" in map(os.path.basename, sys.orig_argv[:2])
if _folder and not _agent:
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
    status: str  # finished | crashed | hung | incomplete | nothing | error (the last three: not run); --verify: VERDICTS
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
    if entry.folder is None:
        shutil.copy(entry.script, work)
    for relative, text in texts.items():
        (work / relative).write_text(text)
    return work / entry.script.relative_to(entry.folder or entry.script.parent)


def argv(script: Path, target: str) -> list[str]:
    if target == "dp":
        return [sys.executable, script.name]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}", script.name]


def environment(bootstrap: Path, stacks: Path, timeout: float) -> dict[str, str]:
    """One thread, this checkout's ddpify and the bootstrap importable, stacks dumped before the timeout."""
    return {**plain_environment(bootstrap), STACK_DIR_VARIABLE: str(stacks), DUMP_AFTER_VARIABLE: str(timeout * DUMP_AT)}


def plain_environment(*first: Path) -> dict[str, str]:
    """One thread, UTF-8 output, the folders `first` then this checkout's ddpify importable."""
    path = [*map(str, first), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "PYTHONPATH": os.pathsep.join(filter(None, path))}


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


def verify_one(entry: Entry, target: str, work: Path, launch: Launch = run_real, timeout: float = VERIFY_TIMEOUT_S,
               steps: int = VERIFY_STEPS) -> Outcome:
    """`ddpify verify` of `entry` with `target`, where its conversion completes, in a copy in `work`: its verdict
    and verdict line, or "timeout" when it outlives `timeout` (verify's own runs time out before: they dump
    their stacks at DUMP_AT of it)."""
    status, converted = conversion(entry, target)
    if status != "converted":
        return Outcome(entry.name, target, status, converted)
    script = write_copy(entry, {}, work / "verify")
    command = [sys.executable, "-m", "ddpify", "verify", "--json", script.name, "--to", target, "--steps", str(steps),
               "--timeout", str(max(1.0, timeout * DUMP_AT))]
    started = time.perf_counter()
    done = launch(command, script.parent, plain_environment(), timeout)
    seconds = time.perf_counter() - started
    if done is None:
        return Outcome(entry.name, target, "timeout", f"still running after {timeout:.0f} s", seconds)
    try:
        result = json.loads(done.stdout)
    except ValueError:
        return Outcome(entry.name, target, "error", f"exit {done.returncode}, no verdict: {exception_line(done.stderr)}", seconds)
    return Outcome(entry.name, target, result["verdict"], result["message"], seconds)


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
    if "ChildFailedError" in error:  # the agent's own traceback: the rank left none (a signal, a bare exit code)
        return root_cause(stderr) or error
    return f"rank {rank}: {error}" if rank else error


def root_cause(stderr: str) -> str:
    """How torchrun's root-cause block says the first failed rank ended: `rank 1: exit code -6 (SIGABRT)`."""
    found = ROOT_CAUSE.search(stderr)
    if not found:
        return ""
    rank, code, signal = found.groups()
    return f"rank {rank}: exit code {code}" + (f" {signal}" if signal else "") + ", no traceback"


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
            timeout: float = TIMEOUT_S, progress=lambda outcome: None, run=run_one) -> list[Outcome]:
    """Every (entry, target) run by `run` (run_one, verify_one), `jobs` at a time, each in a temporary folder of
    its own; in entry order."""
    def one(pair):
        with tempfile.TemporaryDirectory(prefix="ddpify-run-") as work:
            outcome = run(*pair, Path(work), launch, timeout)
        progress(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, [(entry, target) for entry in chosen for target in targets]))


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    ran = [o for o in outcomes if o.status in ("finished", "crashed", "hung")]
    return {"converted and run": len(ran), **{status: sum(o.status == status for o in ran) for status in ("finished", "crashed", "hung")},
            "not run (incomplete, nothing to do, converter error)": len(outcomes) - len(ran)}


def verify_counts(outcomes: list[Outcome], target: str) -> dict[str, int]:
    """Of `target`'s outcomes: the fixtures, the complete conversions, and each verdict of theirs."""
    verified = [o for o in outcomes if o.target == target and o.status in VERDICTS]
    return {"fixtures": sum(o.target == target for o in outcomes), "complete": len(verified),
            **{verdict: sum(o.status == verdict for o in verified) for verdict in VERDICTS}}


def verify_summary(target: str, counted: dict[str, int]) -> str:
    others = ", ".join(f"{verdict} {counted[verdict]}" for verdict in VERDICTS[1:] if counted[verdict])
    return (f"{target}: {counted['complete']} of {counted['fixtures']} complete, {counted['equivalent']} of "
            f"{counted['complete']} verify equivalent{f' ({others})' if others else ''}")


def line(outcome: Outcome) -> str:
    took = f" {outcome.seconds:5.1f} s" if outcome.seconds else ""
    return f"{outcome.entry:36} {outcome.target:10} {outcome.status:13}{took}  {outcome.detail}".rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=TARGETS + ON_REQUEST, default=list(TARGETS))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="fixtures to run (basic_main, real/vae, projects/classic, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="launches at once")
    parser.add_argument("--timeout", type=float, help=f"seconds before a launch counts as hung (default {TIMEOUT_S:g}; "
                                                      f"with --verify, before a verify is killed: {VERIFY_TIMEOUT_S:g})")
    parser.add_argument("--verify", action="store_true", help="run `ddpify verify` on each complete conversion instead")
    parser.add_argument("--steps", type=int, default=VERIFY_STEPS, help="--verify: optimizer steps to compare")
    parser.add_argument("--json", metavar="FILE", help="also write every outcome and the counts here")
    options = parser.parse_args()
    started = time.perf_counter()
    timeout = options.timeout or (VERIFY_TIMEOUT_S if options.verify else TIMEOUT_S)
    run = partial(verify_one, steps=options.steps) if options.verify else run_one
    outcomes = run_all(entries(options.only), tuple(options.targets), options.jobs, run_real, timeout,
                       lambda outcome: print(line(outcome), flush=True), run)
    print()
    if options.verify:
        counted = {target: verify_counts(outcomes, target) for target in options.targets}
        for target, value in counted.items():
            print(verify_summary(target, value))
    else:
        counted = counts(outcomes)
        for name, value in counted.items():
            print(f"{name:56} {value}")
    print(f"({time.perf_counter() - started:.0f} s, --jobs {options.jobs}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    if options.json:
        Path(options.json).write_text(json.dumps({"outcomes": [asdict(o) for o in outcomes], "counts": counted}, indent=1))


if __name__ == "__main__":
    main()
