"""What one verify run records: the loss and the whole parameters and gradients after each optimizer
step (FSDP shards gathered, in their own dtype), the loss of each backward, fingerprints of random draws, flags
and notes; saved as JSON, after which the process leaves at once (`Recorder.finish`). Each step's
parameters and gradients go to their own files as they are recorded (step_tensors): the record names them.

Imports torch and the standard library only, like the harness that fills it.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import pickle
import sys

import torch

from ddpify.verify.step_tensors import StepTensors


class Recorder:
    """Collects the loss and parameters at each optimizer step, plus flags and notes."""

    def __init__(self, path: str, steps: int) -> None:
        self.path = path
        self.limit = steps
        self.losses: list[float | None] = []
        self.params = StepTensors.writing(path, "params", torch.float64)  # read back as float64, as compared
        self.flags: dict[str, str] = {}
        self.notes: list[str] = []
        self.initial: torch.Tensor | None = None  # parameters before the first optimizer step
        self.optimizers: list = []  # every optimizer the script built, in order (see trained)
        self.backward_losses: list[list[float]] = []  # per step: the loss of every backward in it
        self.draws: list[str] = []  # fingerprints of the random draws flagged while training
        self.gradients = StepTensors.writing(path, "gradients", torch.float32)  # per step: those it applied, of params
        self.step_backwards: list[torch.Tensor] = []
        self.last_backward: torch.Tensor | None = None
        self.scaled: tuple[torch.Tensor, torch.Tensor] | None = None
        self.stepped = False  # an optimizer step or a module's zero_grad ended a step
        self.bare: list[torch.Tensor] = []  # the tensors (no nn.Parameter) the last backward reached, till then
        self.bare_values: torch.Tensor | None = None

    def flag(self, name: str, detail: str) -> None:
        self.flags.setdefault(name, detail)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def on_backward(self, tensor: torch.Tensor) -> None:
        """Remember the loss a backward starts from, before any GradScaler scaling. Where no optimizer or
        module steps, a backward after the tensors the last one reached changed (`w -= lr * w.grad` on
        bare tensors) ends the step that update made."""
        if self.scaled is not None and tensor is self.scaled[0]:
            tensor = self.scaled[1]
        if self.last_backward is not None and self.bare_values is not None and not torch.equal(_flat(self.bare), self.bare_values):
            self.record_step(self.bare)
        self.last_backward = tensor
        self.step_backwards.append(tensor.detach())
        if not self.stepped:
            self.bare = _bare_leaves(tensor)
            self.bare_values = _flat(self.bare) if self.bare else None

    def drew(self, drawn) -> None:
        """Remember a random draw made while training (a tensor, numpy's array or number), by its fingerprint."""
        self.draws.append(_fingerprint(drawn))

    def on_optimizer(self, optimizer) -> None:
        """An optimizer was built: its parameters are recorded at every step from now on."""
        if all(known is not optimizer for known in self.optimizers):
            self.optimizers.append(optimizer)

    def trained(self, stepping) -> list[torch.Tensor]:
        """Every parameter of every optimizer built so far, each once, in the order they were built (and
        `stepping`'s, should it have been built unseen): a GAN's discriminator step is compared on the
        generator's parameters too, and every step is measured against the same initial parameters."""
        optimizers = self.optimizers + [stepping] * all(known is not stepping for known in self.optimizers)
        return list({id(p): p for optimizer in optimizers for p in _optimized(optimizer)}.values())

    def before_step(self, optimizer, args, kwargs) -> None:
        """Optimizer step pre-hook: the parameters the first update starts from."""
        if self.initial is None:
            self.initial = _flat(self.trained(optimizer))

    def on_step(self, optimizer, args, kwargs) -> None:
        """Optimizer step post-hook: record, and leave once enough steps are recorded."""
        self.stepped, self.bare_values = True, None
        self.record_step(self.trained(optimizer))

    def on_zero_grad(self, module: torch.nn.Module) -> None:
        """`model.zero_grad()` after a backward that no optimizer stepped: a hand-written update
        (`p -= lr * p.grad`) just ran, so this is the end of a step."""
        if self.last_backward is not None:
            self.stepped, self.bare_values = True, None
            self.record_step(list(module.parameters()))

    def record_step(self, params: list[torch.Tensor]) -> None:
        """Record the loss and `params` after one step; leave once enough steps are recorded."""
        loss = self.last_backward
        self.losses.append(None if loss is None else float(loss.detach().double().mean()))
        self.params.append(_flat(params))
        self.gradients.append(_flat_gradients(params))
        self.backward_losses.append([float(t.double().mean()) for t in self.step_backwards])
        self.last_backward = self.scaled = None
        self.step_backwards = []
        if len(self.params) >= self.limit:
            self.finish(0)

    def save(self) -> None:
        """The record as JSON, naming the files of its vectors (the initial parameters' among them)."""
        initial = StepTensors.writing(self.path, "initial", torch.float64)
        if self.initial is not None:
            initial.append(self.initial)
        record = {"losses": self.losses, "params": self.params.paths, "initial": initial.paths, "flags": self.flags,
                  "notes": self.notes, "backward_losses": self.backward_losses, "draws": self.draws,
                  "gradients": self.gradients.paths}
        with open(self.path + ".tmp", "w", encoding="utf-8") as file:
            json.dump(record, file)
        os.replace(self.path + ".tmp", self.path)

    def finish(self, code: int):
        """Write the record and end the process now, skipping every teardown."""
        faulthandler.cancel_dump_traceback_later()
        self.save()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _optimized(optimizer) -> list[torch.Tensor]:
    """Every parameter the optimizer updates."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' whole values (FSDP shards gathered) as one new CPU vector, of their dtype where they share
    one (float32 parameters take half float64's memory and disk), else float64."""
    dtypes = {t.dtype for t in tensors}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float64
    return torch.cat([_whole(t).reshape(-1).to("cpu", dtype) for t in tensors])


def _flat_gradients(params: list[torch.Tensor]) -> torch.Tensor:
    """The parameters' whole gradients (zeros where none) as one CPU vector, in `_flat`'s order (and dtype rule)."""
    return _flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])


def _bare_leaves(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors, not nn.Parameter, whose gradient a backward from `tensor` accumulates (weights kept in
    bare tensors), by shape then in the order the graph reaches them."""
    found: dict[int, torch.Tensor] = {}
    seen: dict[int, object] = {}  # holds the nodes, so that no id is reused while walking
    stack = [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)
        if variable is not None and not isinstance(variable, torch.nn.Parameter):
            found.setdefault(id(variable), variable)
        stack.extend(reversed([next_node for next_node, _ in node.next_functions]))
    return sorted(found.values(), key=lambda t: tuple(t.shape))


def _fingerprint(drawn) -> str:
    """Shape, dtype and a digest of the values: equal only for equal draws (tensors; numpy's arrays and numbers too)."""
    if not torch.is_tensor(drawn):
        return f"{type(drawn).__name__} {hashlib.blake2b(pickle.dumps(drawn), digest_size=8).hexdigest()}"
    values = drawn.detach().to("cpu").clone(memory_format=torch.contiguous_format)
    digest = hashlib.blake2b(bytes(values.untyped_storage()), digest_size=8).hexdigest()
    return f"{tuple(values.shape)} {values.dtype} {digest}"


def _whole(param: torch.Tensor) -> torch.Tensor:
    """A parameter's full value: FSDP2 shards it into a DTensor, gathered here (every rank steps)."""
    param = param.detach()
    return param.full_tensor() if hasattr(param, "full_tensor") else param
