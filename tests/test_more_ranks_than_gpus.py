"""More processes than GPUs: the converted script's setup says so in words, not `invalid device ordinal`.

On a lent one-GPU machine `torchrun --nproc_per_node=2` of a converted script stopped rank 1 at
`torch.cuda.set_device(1)` with "CUDA error: invalid device ordinal" (docs/gpu-proof.md). The setup now
checks LOCAL_RANK against the GPUs it sees first. Run on CPU with torch.cuda's answers stood in.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from ddpify.codemods.ddp.runtime import HELPERS


def setup_on_gpus(monkeypatch, local_rank: int, gpus: int) -> list:
    """Run the converted setup as rank `local_rank` on a machine of `gpus` GPUs; the devices it sets."""
    monkeypatch.setenv("RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    chosen: list = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: None)
    namespace = {"gc": __import__("gc"), "os": os, "torch": torch, "dist": dist}
    exec(HELPERS, namespace)
    namespace["setup_distributed"]()
    return chosen


def test_a_rank_past_the_last_gpu_stops_with_the_launch_fix(monkeypatch):
    with pytest.raises(SystemExit, match=r"^rank 1: LOCAL_RANK 1 but 1 GPU\(s\): use torchrun --nproc_per_node=1$"):
        setup_on_gpus(monkeypatch, local_rank=1, gpus=1)


def test_a_rank_with_a_gpu_of_its_own_takes_it(monkeypatch):
    assert setup_on_gpus(monkeypatch, local_rank=1, gpus=2) == [1]
