"""One tensor per recorded step (the whole parameters, or gradients, after it), kept on disk, not in memory: each
is saved to its own file as it is recorded and read back, memory-mapped, when a comparison asks for that step.
A process holds about one step's tensors, however many steps verify records (a 100M-parameter model's 20
steps once took 24 GB per process).

A step's file holds the vector's bytes alone, its dtype the file name's suffix (`params.3.float32`): the
vectors are flat, so torch.save's archive and pickle only cost time (~0.5 ms a file to read back through
the weights-only unpickler, 0.02 ms this way; 48 files in a two-rank verify of 8 steps).

Imports torch and the standard library only, like the recorder that writes them.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

import torch


class StepTensors(Sequence):
    """The tensors of `paths`, one file each (names relative to `folder`), read as `dtype`; the last one read
    is kept, as a comparison reads each side's step several times."""

    def __init__(self, folder: str, paths: list[str], dtype: torch.dtype, stem: str = "") -> None:
        self.folder = folder
        self.paths = paths
        self.dtype = dtype
        self.stem = stem  # what append names the files it writes after
        self._last: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return StepTensors(self.folder, self.paths[index], self.dtype)
        index = range(len(self.paths))[index]
        if self._last is None or self._last[0] != index:
            self._last = None  # dropped before the next is read: one step in memory, not two
            self._last = index, _mapped(os.path.join(self.folder, self.paths[index])).to(self.dtype)
        return self._last[1]

    def append(self, tensor: torch.Tensor) -> None:
        """Save the CPU vector `tensor` as the next step's file (`<stem>.<step>.<dtype>` beside the record),
        complete before this returns."""
        name = f"{self.stem}.{len(self.paths)}.{str(tensor.dtype).removeprefix('torch.')}"
        vector = tensor.contiguous()
        with open(os.path.join(self.folder, name), "wb") as file:
            file.write((ctypes.c_char * (vector.numel() * vector.element_size())).from_address(vector.data_ptr()))
        self.paths.append(name)

    @classmethod
    def writing(cls, record_path: str, kind: str, dtype: torch.dtype) -> StepTensors:
        """An empty sequence whose steps are saved beside the record at `record_path` (`record-candidate-0.params.3.float32`)."""
        stem = f"{os.path.splitext(os.path.basename(record_path))[0]}.{kind}"
        return cls(os.path.dirname(record_path) or ".", [], dtype, stem)


def _mapped(path: str) -> torch.Tensor:
    """The vector a step's file holds, mapped from the file (copy-on-write: the file stays as written)."""
    dtype = getattr(torch, path.rpartition(".")[2])
    size = os.path.getsize(path) // dtype.itemsize
    return torch.from_file(path, shared=False, size=size, dtype=dtype)
