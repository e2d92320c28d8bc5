"""Run one training script, unmodified, under hooks that record every optimizer step.

Used in a process forked by the launcher (`run_role`) or as a torchrun worker
(`python -m ddpify.verify.harness PLAN_JSON ROLE`). Before the script starts it:
makes torch deterministic, switches dropout off, captures the tensor each backward
starts from (unscaled when it came from a GradScaler), watches for `reduction='sum'`
losses and plain BatchNorm, re-cuts the reference's training batches (see alignment),
and arms a faulthandler dump for hangs. After `plan.steps` optimizer steps, or when
the script ends, it writes its record and leaves at once with os._exit, so no rank
blocks in teardown.

Imports torch and the standard library only: no libcst, no ddpify command code.
"""

from __future__ import annotations

import ctypes
import faulthandler
import inspect
import os
import random
import runpy
import signal
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.optimizer import register_optimizer_step_post_hook

from ddpify.verify.alignment import align_training_loaders
from ddpify.verify.plan import CANDIDATE, REFERENCE, Plan

SEED = 0
SHARED_GPU_ENV = "DDPIFY_VERIFY_SHARED_GPU"
DEADLINE_ENV = "DDPIFY_VERIFY_DEADLINE"  # wall-clock time at which every process dumps its stacks
PR_SET_PDEATHSIG = 1
DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


class Recorder:
    """Collects the loss and parameters at each optimizer step, plus flags and notes."""

    def __init__(self, path: str, steps: int) -> None:
        self.path = path
        self.limit = steps
        self.losses: list[float | None] = []
        self.params: list[torch.Tensor] = []
        self.flags: dict[str, str] = {}
        self.notes: list[str] = []
        self.last_backward: torch.Tensor | None = None
        self.scaled: tuple[torch.Tensor, torch.Tensor] | None = None

    def flag(self, name: str, detail: str) -> None:
        self.flags.setdefault(name, detail)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def on_backward(self, tensor: torch.Tensor) -> None:
        """Remember the loss a backward starts from, before any GradScaler scaling."""
        if self.scaled is not None and tensor is self.scaled[0]:
            tensor = self.scaled[1]
        self.last_backward = tensor

    def on_step(self, optimizer, args, kwargs) -> None:
        """Optimizer step post-hook: record, and leave once enough steps are recorded."""
        loss = self.last_backward
        self.losses.append(None if loss is None else float(loss.detach().double().mean()))
        self.params.append(torch.cat([p.detach().reshape(-1).to("cpu", torch.float64)
                                      for group in optimizer.param_groups for p in group["params"]]))
        self.last_backward = self.scaled = None
        if len(self.params) >= self.limit:
            self.finish(0)

    def save(self) -> None:
        record = {"losses": self.losses, "params": self.params, "flags": self.flags, "notes": self.notes}
        torch.save(record, self.path + ".tmp")
        os.replace(self.path + ".tmp", self.path)

    def finish(self, code: int):
        """Write the record and end the process now, skipping every teardown."""
        faulthandler.cancel_dump_traceback_later()
        self.save()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def make_deterministic() -> None:
    """Same seeds, deterministic kernels, no TF32, one thread.

    Sets the flag behind torch.use_deterministic_algorithms(True, warn_only=True) directly:
    the public call also imports torch._inductor.config, which costs more CPU than the rest
    of verify's start-up (and only matters to torch.compile).
    """
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    random.seed(SEED)


def _arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by name, defaults included."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def disable_dropout(recorder: Recorder) -> None:
    """Make every functional dropout (hence nn.Dropout & co.) the identity."""
    for name in DROPOUT_FUNCTIONS:
        signature = inspect.signature(getattr(F, name))

        def identity(*args, _signature=signature, **kwargs):
            arguments = _arguments(_signature, args, kwargs)
            if arguments["training"] and arguments["p"] > 0:
                recorder.flag("dropout", "the script uses dropout; it is switched off in both runs")
            return arguments["input"]

        setattr(F, name, identity)


def watch_sum_reduction(recorder: Recorder) -> None:
    """Flag losses computed with reduction='sum' while autograd records (eval losses are ignored)."""
    for name in dir(F):
        function = getattr(F, name)
        if name.startswith("_") or not callable(function):
            continue
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            continue
        if "reduction" not in signature.parameters:
            continue

        def watched(*args, _function=function, _signature=signature, _name=name, **kwargs):
            if torch.is_grad_enabled() and _arguments(_signature, args, kwargs)["reduction"] == "sum":
                recorder.flag("sum_reduction", f"{_name}(reduction='sum')")
            return _function(*args, **kwargs)

        setattr(F, name, watched)


def watch_plain_batchnorm(recorder: Recorder) -> None:
    """Flag BatchNorm layers (not SyncBatchNorm, which overrides forward) used in training mode."""
    forward = _BatchNorm.forward

    def watched(self, input):
        if self.training:
            recorder.flag("plain_batchnorm", type(self).__name__)
        return forward(self, input)

    _BatchNorm.forward = watched


def capture_backward(recorder: Recorder) -> None:
    """Record the tensor each backward starts from; Tensor.backward goes through autograd.backward."""
    backward = torch.autograd.backward
    scale = torch.amp.GradScaler.scale

    def recorded_backward(tensors, *args, **kwargs):
        recorder.on_backward(tensors if isinstance(tensors, torch.Tensor) else next(iter(tensors)))
        return backward(tensors, *args, **kwargs)

    def remembered_scale(self, outputs):
        scaled = scale(self, outputs)
        if isinstance(outputs, torch.Tensor):
            recorder.scaled = (scaled, outputs)
        return scaled

    torch.autograd.backward = recorded_backward
    torch.amp.GradScaler.scale = remembered_scale


def share_single_gpu() -> None:
    """N ranks on one GPU: every rank uses cuda:0 and gloo (nccl refuses duplicate GPUs)."""
    import torch.distributed as dist

    init_process_group = dist.init_process_group
    os.environ["LOCAL_RANK"] = "0"

    def gloo_init(*args, **kwargs):
        kwargs.pop("backend", None)
        return init_process_group("gloo", *args[1:], **kwargs)

    dist.init_process_group = gloo_init


def die_with_parent() -> None:
    """On Linux, get SIGKILLed when the parent dies: torchrun starts its workers in sessions
    of their own, out of reach of the kill of the launcher's process group."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def arm_stack_dump(path: str) -> None:
    """Dump every thread's stack into `path` at the launcher's deadline, in case this process hangs
    (faulthandler keeps the file open)."""
    delay = max(float(os.environ[DEADLINE_ENV]) - time.time(), 0.1)
    faulthandler.dump_traceback_later(delay, file=open(path, "w"))


def redirect_output(path: str) -> None:
    """Send this process's stdout and stderr (file descriptors included) to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_script(script: str, args: tuple[str, ...], import_dir: str) -> None:
    """Run `script` as `__main__` the way `python script.py args` would."""
    sys.argv = [script, *args]
    sys.path[0] = import_dir
    runpy.run_path(script, run_name="__main__")


def install_hooks(plan: Plan, role: str, recorder: Recorder) -> None:
    make_deterministic()
    disable_dropout(recorder)
    watch_sum_reduction(recorder)
    watch_plain_batchnorm(recorder)
    capture_backward(recorder)
    register_optimizer_step_post_hook(recorder.on_step)
    if role == REFERENCE and plan.aligns_reference():
        script = os.path.realpath(plan.reference.script)
        static_sites = {(script, line) for line in plan.reference_training_lines}
        align_training_loaders(plan.nproc, plan.batch_mode, static_sites, recorder)
    if role == CANDIDATE and os.environ.get(SHARED_GPU_ENV):
        share_single_gpu()


def run_role(plan: Plan, role: str):
    """Run the plan's `role` script as rank $RANK under the hooks; never returns."""
    rank = int(os.environ.get("RANK", "0"))
    run = plan.run(role)
    die_with_parent()
    os.chdir(run.workdir)
    redirect_output(plan.file("log", role, rank))
    arm_stack_dump(plan.file("stack", role, rank))
    recorder = Recorder(plan.file("record", role, rank), plan.steps)
    install_hooks(plan, role, recorder)
    try:
        run_script(run.script, plan.script_args, run.import_dir)
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            _fail(plan.file("error", role, rank), recorder)
    except BaseException:
        _fail(plan.file("error", role, rank), recorder)
    recorder.finish(0)


def _fail(error_path: str, recorder: Recorder):
    """Write the current exception's traceback next to the partial record, and exit 1."""
    text = traceback.format_exc()
    sys.stderr.write(text)
    with open(error_path, "w") as f:
        f.write(text)
    recorder.finish(1)


if __name__ == "__main__":
    run_role(Plan.load(sys.argv[1]), sys.argv[2])
