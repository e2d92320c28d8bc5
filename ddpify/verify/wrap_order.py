"""Catch, on CPU, a model moved after its DDP wrap: on GPUs that order breaks.

`DistributedDataParallel(model)` reads the parameters' device when it is built: wrapped while still on
the CPU, a model later moved with `.to(device)` / `.cuda()` leaves DDP's reducer on the old tensors
(NCCL refuses CPU tensors; gradients stop syncing). On a CPU run every device is the CPU, so the move
changes nothing and the run looks right. The candidate's processes record the modules each DDP wrap
holds, and flag a `.to()`, `.cuda()` or `.cpu()` on one of them (or on the wrapper) before the
wrapper's first forward.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from ddpify.anatomy.vocabulary import DEVICE_MOVES

MOVED_FLAG = "moved_after_wrap"
_MOVES = (*sorted(DEVICE_MOVES), "cpu")


def watch_moves_after_wrap(flag: Callable[[str, str], None]) -> None:
    """Flag (MOVED_FLAG) a move, before the wrapper's first forward, of a module that a DDP wrap holds,
    with where it was made (moving it once training is over, `model.module.cpu()` to save, is harmless)."""
    holders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> the wrapper holding it
    started: weakref.WeakSet = weakref.WeakSet()  # wrappers that ran a forward
    build = DistributedDataParallel.__init__

    @functools.wraps(build)
    def recorded(self, module, *args, **kwargs):
        build(self, module, *args, **kwargs)
        holders.update((m, self) for m in (self, *module.modules()))
        self.register_forward_pre_hook(lambda wrapper, inputs: started.add(wrapper))

    DistributedDataParallel.__init__ = recorded
    for name in _MOVES:
        setattr(torch.nn.Module, name, _watched(getattr(torch.nn.Module, name), name, holders, started, flag))


def _watched(move, name: str, holders: weakref.WeakKeyDictionary, started: weakref.WeakSet, flag: Callable[[str, str], None]):
    @functools.wraps(move)
    def watched(self, *args, **kwargs):
        wrapper = holders.get(self)
        if wrapper is not None and wrapper not in started:
            caller = sys._getframe(1)
            where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
            flag(MOVED_FLAG, f"{type(self).__name__}.{name}(...) at {where}, after the model was wrapped in DistributedDataParallel")
        return move(self, *args, **kwargs)

    return watched
