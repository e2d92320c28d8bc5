"""Run one verify pair from the command's side: workspace, candidate, launcher, cleanup.

The launcher starts first, so that its torch import overlaps the conversion, and
runs in a new session (its own process group); whatever way it ends, the whole group
is killed afterwards, so no rank or DataLoader worker outlives verify, and so is every
process a script started in a session of its own (see ddpify.verify.reaper). No torch
import here: the launcher pays for it once.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ddpify.codemods.ddp.environments import EnvironmentsOfEachRank
from ddpify.codemods.ddp.hand_gradients import HandAveragedGradients
from ddpify.codemods.ddp.owned_optimizers import AveragedOwnedOptimizers
from ddpify.codemods.ddp.rows import RowsOfEachRank
from ddpify.verify.diagnose import exception_line_in
from ddpify.verify.plan import CANDIDATE, PACKAGE_ROOT, REFERENCE, Plan, Run
from ddpify.verify import reaper
from ddpify.verify.reaper import adopting_orphans, kill_descendants
from ddpify.verify.result import error_result
from ddpify.verify.project_root import Root, given_root, project_root
from ddpify.verify.script_batch import script_batch
from ddpify.verify.workspace import mirror, relative_inside

if TYPE_CHECKING:
    from ddpify.codemods.pipeline import ConversionResult

LAUNCHER_SLACK_S = 30.0  # torch import and comparison, on top of the runs' own timeout


@dataclass(frozen=True)
class Request:
    """The command line, as verify needs it."""

    script: str
    target: str
    against: str | None
    nproc: int
    steps: int
    device: str
    batch_mode: str
    timeout: float
    launcher: str
    script_args: tuple[str, ...]
    keep: bool = False
    mixed_precision: str = "keep"  # --to fsdp: convert with this --mixed-precision
    root: str | None = None  # --root: the folder to mirror (default: found, see project_root)


class CandidateUnavailable(Exception):
    """No candidate script could be produced (converter missing or failing)."""


def convert(request: Request) -> tuple[dict[Path, ConversionResult], list[str]]:
    """The conversions by original path (the entry first, then the project modules it imports
    that change, see ddpify.project_conversion), and the converter's advice and missing items."""
    try:
        from ddpify.project_conversion import convert_entry
    except ImportError as error:
        raise CandidateUnavailable(f"the converter is not available ({error}); pass --against") from error
    script = Path(os.path.abspath(request.script))
    try:
        project = convert_entry(script, request.target, {"batch_size": request.batch_mode, "mixed_precision": request.mixed_precision})
        entry = project.job(script)
        conversion = entry.convert() if entry else None
        modules = {job.path: job.convert() for job in project.jobs if job.changed and not job.entry}
    except Exception as error:  # the converter's own failure is verify's "could not run"
        raise CandidateUnavailable(f"conversion failed: {type(error).__name__}: {error}") from error
    if conversion is None:
        raise CandidateUnavailable(f"conversion failed: {project.project.unreadable.get(script)}")
    if not conversion.changed and not modules:
        why = conversion.reason if conversion.missing else conversion.note
        raise CandidateUnavailable("the converter left the script unchanged" + (f" ({why})" if why else ""))
    notes = []
    for job in project.jobs:
        where = "" if job.entry else f"{job.path.name} "
        notes += [f"converter advice, {where}line {advice.line}: {advice.message}" for advice in job.result.warnings] if job.result else []
        notes += [f"conversion incomplete, {where}line {m.line}: {m.what}; {m.todo}" for m in job.result.missing] if job.result else []
    return {script: conversion, **modules}, notes


def training_loaders(script: str) -> dict[int, tuple[tuple[int, int, int], ...]]:
    """The DataLoader calls, and calls of project functions that build one, that ddpify's static
    analysis sees a training loop iterate: line -> the epoch loops around it, where the converted
    script calls `set_epoch(epoch)`, each as (first line, last line, the epoch its first iteration sets)."""
    from ddpify.anatomy.project import Project

    try:
        project = Project([Path(script)], lambda path: Path(path).read_text())
        anatomy = next(module.anatomy for module in project.files() if project.is_entry(module))
    except Exception:  # a script the analysis cannot read: training loaders are then found at run time
        return {}
    return {loader.line: tuple(_epoch_loop(loop.node) for loop in anatomy.epoch_loops_around(loader))
            for loader in (*anatomy.loaders, *anatomy.foreign_loaders) if loader.is_train}


def _epoch_loop(loop: ast.For | ast.While) -> tuple[int, int, int]:
    """`for epoch in range(1, n):` sets epoch 1 first; other loops (a `while` counting its passes) 0."""
    it, first = getattr(loop, "iter", None), 0
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and len(it.args) >= 2:
        start = it.args[0]
        first = start.value if isinstance(start, ast.Constant) and type(start.value) is int else 0
    return loop.lineno, loop.end_lineno or loop.lineno, first


def make_plan(request: Request, workspace: str, converted: dict[Path, ConversionResult] | None) -> tuple[Plan, list[str]]:
    """Each side runs in its own mirror of the project root (see mirrored_root and workspace.py), in
    its mirror of the working directory, its script at the mirrored place and `sys.argv[0]` as the
    user typed it; notes say what was mirrored and what is linked.

    The candidate's mirror holds the converted entry as `<name>_<to>.py`, and the converted
    project modules in place of their originals (it is verify's own copy)."""
    home = Path.cwd().resolve()
    root = mirrored_root(request, home)
    sides = {side: mirror(root.folder, Path(workspace) / side, outside=Path(workspace), first=home) for side in (REFERENCE, CANDIDATE)}
    places = {side: Place(sides[side].root, root.folder, sides[side].root / home.relative_to(root.folder)) for side in sides}
    reference = places[REFERENCE].run(Path(request.script), request.script, ranks=1)
    if converted is None:
        candidate = places[CANDIDATE].run(Path(request.against), request.against, ranks=_ranks(request))
    else:
        typed = str(Path(request.script).with_name(f"{Path(request.script).stem}_{request.target}.py"))
        candidate = places[CANDIDATE].run(Path(typed), typed, ranks=_ranks(request), fallback=Path(workspace))
        (entry, conversion), *modules = converted.items()
        Path(candidate.script).write_text(conversion.output)
        placed = {candidate.script: (entry, conversion)}
        for path, module in modules:
            placed[_converted_module(path, module.output, root.folder, sides[CANDIDATE].root)] = (path, module)
    loaders = training_loaders(request.script)
    plan = Plan(target=request.target, steps=request.steps, device=request.device, batch_mode=request.batch_mode,
                timeout=request.timeout, launcher=request.launcher, outdir=workspace,
                script_args=tuple(request.script_args), reference=reference, candidate=candidate,
                reference_training_lines=tuple(loaders),
                reference_epoch_loops=tuple((line, *loop) for line, loops in loaders.items() for loop in loops),
                dp_replicas=request.nproc if request.target == "dp" else 0,
                changes=tuple(_changes_by_line(placed) if converted else ()),
                loss_rows_shared=_made_changes(converted, RowsOfEachRank.NAME),
                plays_own_episodes=_made_changes(converted, EnvironmentsOfEachRank.NAME),
                averages_by_hand=any(_made_changes(converted, t.NAME) for t in (AveragedOwnedOptimizers, HandAveragedGradients)),
                home=str(root.folder), script_batch=script_batch(request.script, request.script_args) if request.batch_mode == "per-gpu" else None)
    notes = ([root.note] if root.note else []) + [note for side in sides.values() if (note := side.note())]
    return plan, list(dict.fromkeys(notes))


def mirrored_root(request: Request, home: Path) -> Root:
    """The folder both sides mirror: --root, or the project root the run reaches from `home` (see project_root)."""
    if request.root:
        return given_root(request.root, home)
    scripts = [Path(path) for path in (request.script, request.against) if path]
    typed = [path for path in (request.script, request.against) if path] + list(request.script_args)
    return project_root(home, scripts, typed, os.environ.get("PYTHONPATH", ""))


def _converted_module(path: Path, text: str, home: Path, root: Path) -> str:
    """Put a converted project module where the candidate imports it from; that path."""
    inside = relative_inside(path, home)
    if inside is None:
        raise CandidateUnavailable(f"{path}: a converted module outside the folder verify mirrors ({home}); "
                                   f"run verify from the project's root, or pass --root")
    (root / inside).write_text(text)
    return str(root / inside)


def _made_changes(converted: dict[Path, ConversionResult] | None, transform: str) -> bool:
    """Did the named transform change any converted file?"""
    return any(change.transform == transform for conversion in (converted or {}).values() for change in conversion.changes)


def _changes_by_line(placed: dict[str, tuple[Path, ConversionResult]]) -> Iterator[tuple[str, int, str]]:
    """(candidate file, line, the change that wrote it) for every line of the converted files that the
    converter wrote (its text is not the original line's) and whose original line, or the statement
    before it (a line inserted after a statement maps to the line that follows), the report names: what
    a hang report names."""
    for file, (original, conversion) in placed.items():
        source = conversion.source.splitlines()
        changes: dict[int, list[str]] = {}
        for change in conversion.changes:
            changes.setdefault(change.line, []).append(f"[{change.transform}] {change.message}")
        for line, text in enumerate(conversion.output.splitlines(), 1):
            at = conversion.original_line(line)
            if 0 < at <= len(source) and text == source[at - 1]:
                continue
            before = next((n for n in range(min(at - 1, len(source)), 0, -1) if source[n - 1].strip()), None)
            reported = next((n for n in (at, before) if n in changes), None)
            if reported:
                yield file, line, f"line {reported} of {original.name}: " + "; ".join(changes[reported])


def _ranks(request: Request) -> int:
    return request.nproc if request.target != "dp" else 1


@dataclass(frozen=True)
class Place:
    """Where one side runs: its mirror of the user's `home` folder, and its mirror of the working directory."""

    mirror: Path
    home: Path
    workdir: Path

    def run(self, script: Path, typed: str, ranks: int, fallback: Path | None = None) -> Run:
        """A script inside the mirrored folder runs as its copy in the mirror; one outside runs where it
        is (a converted one is written to `fallback`, next to nothing)."""
        inside = relative_inside(script, self.home)
        if inside is not None:
            path = self.mirror / inside
        elif fallback is not None:
            path = fallback / script.name
        else:
            path = script.resolve()
        import_dir = path.parent if inside is not None or fallback is None else script.resolve().parent
        argv0 = typed if inside is not None and not Path(typed).is_absolute() else str(path)
        self.workdir.mkdir(parents=True, exist_ok=True)
        return Run(str(path), str(import_dir), str(self.workdir), ranks, argv0, str(self.mirror))


def launcher_environment(device: str) -> dict[str, str]:
    """Deterministic, single-threaded, ddpify importable; GPUs hidden for --device cpu."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0", PYTHONUNBUFFERED="1",
               CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTORCH_NVML_BASED_CUDA_CHECK="1")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def start_launcher(workspace: str, device: str) -> subprocess.Popen:
    """Start the launcher in its own session; it imports torch, then waits for a plan on stdin."""
    with open(os.path.join(workspace, "launcher.txt"), "w") as log:
        return subprocess.Popen([sys.executable, "-m", "ddpify.verify.launcher"], stdin=subprocess.PIPE,
                                stdout=log, stderr=subprocess.STDOUT, cwd=workspace, text=True,
                                env=launcher_environment(device), start_new_session=True)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL every process left in the launcher's group, then reap the launcher."""
    reaper.kill_group(process.pid)
    process.stdin.close()
    process.wait()


def run_plan(launcher: subprocess.Popen, plan: Plan) -> dict:
    """Hand `plan` to the launcher, wait within the timeout (plus slack), and read its verdict."""
    launcher.stdin.write(plan.save() + "\n")
    launcher.stdin.close()
    try:
        launcher.wait(timeout=plan.timeout + LAUNCHER_SLACK_S)
    except subprocess.TimeoutExpired:
        return error_result(f"the launcher did not finish within {plan.timeout + LAUNCHER_SLACK_S:g} s")
    if not os.path.exists(plan.result_path):
        return error_result(f"the launcher failed: {exception_line_in(os.path.join(plan.outdir, 'launcher.txt'))}")
    with open(plan.result_path) as f:
        return json.load(f)


def verify(request: Request) -> dict:
    """Convert if needed, run the pair, and return the verdict dict (see ddpify.verify.result).

    The workspace is removed afterwards, unless the pair could not run: then its logs are kept.
    """
    workspace = tempfile.mkdtemp(prefix="ddpify-verify-")
    notes: list[str] = []
    with adopting_orphans() as existing_children:
        launcher = start_launcher(workspace, request.device)
        try:
            converted = None
            if not request.against:
                converted, notes = convert(request)
            plan, mirror_notes = make_plan(request, workspace, converted)
            notes += mirror_notes
            result = run_plan(launcher, plan)
        except CandidateUnavailable as error:
            result = error_result(str(error))
        finally:
            kill_group(launcher)
            kill_descendants(spared=existing_children)
    result["notes"] = notes + result["notes"]
    if result["verdict"] == "error" or request.keep:
        result["notes"].append(f"logs kept in {workspace}")
    else:
        shutil.rmtree(workspace, ignore_errors=True)
    return result
