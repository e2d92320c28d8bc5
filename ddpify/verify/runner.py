"""Run one verify pair from the command's side: workspace, candidate, launcher, cleanup.

The launcher starts first, so that its torch import overlaps the conversion, and
runs in a new session (its own process group); whatever way it ends, the whole group
is killed afterwards, so no rank or DataLoader worker outlives verify. No torch
import here: the launcher pays for it once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddpify.verify.diagnose import last_line
from ddpify.verify.plan import Plan, Run
from ddpify.verify.result import error_result

LAUNCHER_SLACK_S = 30.0  # torch import and comparison, on top of the runs' own timeout
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


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


class CandidateUnavailable(Exception):
    """No candidate script could be produced (converter missing or failing)."""


def convert_into(request: Request, workspace: str) -> tuple[str, list[str]]:
    """Convert the script with ddpify.convert into `workspace`; return its path and the converter's warnings."""
    try:
        from ddpify.convert import convert_source
    except ImportError as error:
        raise CandidateUnavailable(f"the converter is not available ({error}); pass --against") from error
    source = Path(request.script).read_text()
    try:
        conversion = convert_source(source, request.target, path=request.script, batch_size=request.batch_mode)
    except Exception as error:  # the converter's own failure is verify's "could not run"
        raise CandidateUnavailable(f"conversion failed: {type(error).__name__}: {error}") from error
    if conversion.output == source:
        raise CandidateUnavailable("the converter left the script unchanged"
                                   + (f" ({conversion.note})" if conversion.note else ""))
    path = os.path.join(workspace, f"{Path(request.script).stem}_{request.target}.py")
    Path(path).write_text(conversion.output)
    return path, [f"converter advice, line {advice.line}: {advice.message}" for advice in conversion.warnings]


def training_loader_lines(script: str) -> tuple[int, ...]:
    """Lines of the DataLoader calls that ddpify's static analysis sees a training loop iterate."""
    from ddpify.anatomy import analyze

    try:
        anatomy = analyze(Path(script).read_text(), script)
    except Exception:  # a script the analysis cannot read: training loaders are then found at run time
        return ()
    return tuple(loader.line for loader in anatomy.loaders if loader.is_train)


def make_plan(request: Request, candidate: str, workspace: str) -> Plan:
    """Absolute paths, one empty working directory per side, candidate imports resolved next to the original."""
    script = os.path.abspath(request.script)
    workdirs = {}
    for side in ("reference", "candidate"):
        workdirs[side] = os.path.join(workspace, side)
        os.makedirs(workdirs[side])
    candidate_dir = os.path.dirname(os.path.abspath(request.against or script))
    return Plan(target=request.target, steps=request.steps, device=request.device, batch_mode=request.batch_mode,
                timeout=request.timeout, launcher=request.launcher, outdir=workspace,
                script_args=tuple(request.script_args),
                reference=Run(script, os.path.dirname(script), workdirs["reference"], 1),
                candidate=Run(os.path.abspath(candidate), candidate_dir, workdirs["candidate"],
                              request.nproc if request.target == "ddp" else 1),
                reference_training_lines=training_loader_lines(script))


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
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
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
        return error_result(f"the launcher failed: {last_line(os.path.join(plan.outdir, 'launcher.txt'))}")
    with open(plan.result_path) as f:
        return json.load(f)


def verify(request: Request) -> dict:
    """Convert if needed, run the pair, and return the verdict dict (see ddpify.verify.result).

    The workspace is removed afterwards, unless the pair could not run: then its logs are kept.
    """
    workspace = tempfile.mkdtemp(prefix="ddpify-verify-")
    launcher = start_launcher(workspace, request.device)
    notes: list[str] = []
    try:
        if request.against:
            candidate = request.against
        else:
            candidate, notes = convert_into(request, workspace)
        result = run_plan(launcher, make_plan(request, candidate, workspace))
    except CandidateUnavailable as error:
        result = error_result(str(error))
    finally:
        kill_group(launcher)
    result["notes"] = notes + result["notes"]
    if result["verdict"] == "error":
        result["notes"].append(f"logs kept in {workspace}")
    else:
        shutil.rmtree(workspace, ignore_errors=True)
    return result
