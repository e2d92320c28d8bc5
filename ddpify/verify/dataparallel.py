"""nn.DataParallel's multi-GPU semantics, simulated in one process without two GPUs.

With fewer than two GPUs, `nn.DataParallel.forward` just calls the wrapped module, which hides
everything DataParallel changes. `simulate_data_parallel(n)` makes it do what it does on n GPUs,
through torch's own `scatter_kwargs`, `replicate` and `gather`, with the three steps that need
CUDA (Scatter, Broadcast, Gather) done on one device instead (chunk, alias or copy,
concatenate). What is reproduced:

- scatter: positional and keyword inputs are split along `dim` into at most n chunks with
  `Tensor.chunk` (a batch of 5 on 2 replicas is 3 + 2, a batch of 1 runs one replica) and put on
  the module's device, as DataParallel puts them on its GPUs (a forward may rely on that: a
  CPU batch reaches a model on cuda:0 as a CUDA tensor); tuples, lists, dicts and namedtuples are
  walked, other objects go to every replica as they are;
- replicate: every submodule is copied shallowly, as on GPUs, so attributes assigned in forward
  (counters, caches) are lost with the replica; replica 0 shares the original's parameters and
  buffers, so its in-place buffer updates (BatchNorm running statistics, from the first chunk
  only) are kept, the other replicas work on copies; the gradients of every replica sum into the
  original parameters; plain BatchNorm normalizes each chunk with its own statistics;
- gather: outputs are concatenated along `dim`, a scalar per replica (a loss computed in
  forward) becoming a vector of one value per replica, and nested outputs walked as torch does;
  such scalars from chunks of different sizes are flagged: their mean is not the batch's loss.

Not reproduced: replicas run one after another, not in threads (no races, no per-GPU streams),
every replica runs on the module's one device, and `device_ids` is not consulted.

Imports torch and the standard library only (the harness loads it).
"""

from __future__ import annotations

import importlib
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

scatter_gather = importlib.import_module("torch.nn.parallel.scatter_gather")
replicate_module = importlib.import_module("torch.nn.parallel.replicate")  # the package exports the function

UNEVEN_FLAG = "uneven_replica_losses"  # the record's flags: a forward returned scalars from chunks of different sizes
Flag = Callable[[str, str], None]  # Recorder.flag
SPLIT_INPUT_HINT = ("nn.DataParallel split every tensor that forward takes along dim 0, one part per GPU: an input whose rows "
                    "are not the batch's samples (a graph's adjacency, a table every sample reads) no longer lines up with "
                    "the others; keep it in the model (a buffer) rather than passing it to forward, or train on one GPU")
_SHAPE_ERRORS = ("cannot be multiplied", "must match the size of tensor", "Sizes of tensors must match", "size mismatch")
UNAVERAGED_LOSS_HINT = ("nn.DataParallel gathered the scalar that forward returned into a vector of one value per "
                        "replica: average it (loss.mean()) before backward")


@dataclass(frozen=True)
class _ChunkScatter:
    """Scatter on one device: the chunks comm.scatter would send to each GPU, put on `device` (the
    module's) as DataParallel puts them on its GPUs; left where they are when it is None."""

    device: torch.device | None

    def apply(self, target_gpus, chunk_sizes, dim, tensor):
        chunks = tensor.chunk(len(target_gpus), dim)
        return chunks if self.device is None else tuple(chunk.to(self.device) for chunk in chunks)


class _ConcatGather:
    """Gather on one device: concatenate along `dim`; scalars become a vector, with torch's warning."""

    @staticmethod
    def apply(target_device, dim, *outputs):
        if dim == 0 and all(output.dim() == 0 for output in outputs):
            warnings.warn("Was asked to gather along dimension 0, but all input tensors were scalars; "
                          "will instead unsqueeze and return a vector.", stacklevel=2)
            outputs = tuple(output.view(1) for output in outputs)
        return torch.cat(outputs, dim)


def _broadcast(tensors, devices, detach=False) -> list[list[torch.Tensor]]:
    """Broadcast on one device: replica 0 gets the originals (aliases that gradients flow through
    unless `detach`), the others copies."""
    if not tensors:
        return []
    first = list(tensors) if detach else [tensor.view_as(tensor) for tensor in tensors]
    copies = [[tensor.detach().clone() if detach else tensor.clone() for tensor in tensors] for _ in devices[1:]]
    return [first, *copies]


@contextmanager
def _on_one_device(device: torch.device | None = None):
    """Swap torch's CUDA scatter (onto `device`), broadcast and gather steps for their single-device twins."""
    saved = scatter_gather.Scatter, scatter_gather.Gather, replicate_module._broadcast_coalesced_reshape
    scatter_gather.Scatter, scatter_gather.Gather = _ChunkScatter(device), _ConcatGather
    replicate_module._broadcast_coalesced_reshape = _broadcast
    try:
        yield
    finally:
        scatter_gather.Scatter, scatter_gather.Gather, replicate_module._broadcast_coalesced_reshape = saved


def simulated_forward(wrapper: nn.DataParallel, replicas: int, inputs: tuple, kwargs: dict, flag: Flag):
    """DataParallel.forward as on `replicas` GPUs: scatter, replicate, apply one replica after another, gather."""
    devices = list(range(replicas))
    with _on_one_device(_module_device(wrapper.module)):
        inputs, kwargs = scatter_gather.scatter_kwargs(inputs, kwargs, devices, wrapper.dim)
    if not inputs and not kwargs:
        inputs, kwargs = ((),), ({},)
    if replicas == 1:
        return wrapper.module(*inputs[0], **kwargs[0])
    with _on_one_device():
        copies = replicate_module.replicate(wrapper.module, devices[:len(inputs)], not torch.is_grad_enabled())
    outputs = [copy(*args, **kws) for copy, args, kws in zip(copies, inputs, kwargs)]
    sizes = [next((t.shape[wrapper.dim] for t in _tensors(part) if t.dim() > wrapper.dim), 0)
             for part in zip(inputs, kwargs)]
    if len(set(sizes)) > 1 and torch.is_grad_enabled() and any(t.dim() == 0 for t in _tensors(outputs[0])):
        flag(UNEVEN_FLAG, f"DataParallel split a batch of {sum(sizes)} into {' + '.join(map(str, sizes))} and forward "
                          f"returned a scalar per replica: their mean weighs the samples unequally, unlike the whole "
                          f"batch's loss (use a batch size divisible by the number of GPUs)")
    with _on_one_device():
        return scatter_gather.gather(outputs, None, wrapper.dim)


def _module_device(module: nn.Module) -> torch.device | None:
    """Where the module's first parameter (or buffer) lives; None for a module with neither."""
    first = next(module.parameters(), None)
    if first is None:
        first = next(module.buffers(), None)
    return None if first is None else first.device


def _tensors(obj) -> Iterator[torch.Tensor]:
    """Every tensor in an input or output, through tuples, lists and dicts."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list, dict)):
        for item in obj.values() if isinstance(obj, dict) else obj:
            yield from _tensors(item)


def simulate_data_parallel(replicas: int, flag: Flag = lambda name, detail: None) -> None:
    """Make every nn.DataParallel in this process run its forward as `replicas` simulated GPUs;
    `flag(name, detail)` hears of uneven splits (UNEVEN_FLAG)."""
    init = nn.DataParallel.__init__

    def keep_dim(self, module, device_ids=None, output_device=None, dim=0):
        init(self, module, device_ids, output_device, dim)
        self.dim = dim  # DataParallel forgets it when it finds no GPU

    def forward(self, *inputs, **kwargs):
        with torch.autograd.profiler.record_function("DataParallel.forward"):
            return simulated_forward(self, replicas, inputs, kwargs, flag)

    nn.DataParallel.__init__ = keep_dim
    nn.DataParallel.forward = forward


def failure_hint(error: str) -> str | None:
    """Why a simulated-DataParallel run failed, when the error is one DataParallel causes."""
    if "can be implicitly created only for scalar outputs" in error:
        return UNAVERAGED_LOSS_HINT
    return SPLIT_INPUT_HINT if any(shape in error for shape in _SHAPE_ERRORS) else None
