"""What the expert ports share: the process group, this rank's device, a loss averaged over ranks.

Each port imports its fixture's model and data code (the fixtures' folders are put on sys.path
here), so a port differs from ddpify's conversion only in how it distributes the training.
"""
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "fixtures"), str(ROOT / "fixtures" / "real"), str(ROOT / "fixtures" / "fsdp"),
                str(ROOT / "bench" / "overhead_fixtures")]


def start() -> tuple[int, int, torch.device]:
    """Join the process group (NCCL on GPUs, gloo on CPU): (rank, world size, this rank's device)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def device_ids(device: torch.device) -> list[int] | None:
    """DDP's device_ids: this GPU, or None on CPU."""
    return [device.index] if device.type == "cuda" else None


def mean_over_ranks(*values) -> list[float]:
    """Losses (tensors of one dtype, or numbers) averaged over the ranks in one all_reduce, as numbers."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    stacked = torch.stack([v.detach() if torch.is_tensor(v) else torch.tensor(v, dtype=torch.float64) for v in values]).to(device)
    dist.all_reduce(stacked)
    return (stacked / dist.get_world_size()).tolist()


def stop() -> None:
    """Leave the process group once the DDP wrappers' reducers are released (gloo can abort or hang at
    exit when a reducer outlives the group: about 1 launch in 4 of shape_gan.py did, with the wrappers
    only collected); as the converted scripts' cleanup_distributed does."""
    gc.collect()
    for wrapper in gc.get_objects():
        if isinstance(wrapper, torch.nn.parallel.DistributedDataParallel):
            wrapper.reducer = wrapper.logger = None
    gc.collect()
    dist.destroy_process_group()
