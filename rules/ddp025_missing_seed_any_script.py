"""DDP025: a multi-GPU script seeds no RNG (off by default: every script, caring or not)."""

from __future__ import annotations

from ddpify.anatomy.distributed import seeding
from ddpify.lint import Invalid
from ddpify.rules.ddp024_missing_seed import MissingSeed


class MissingSeedAnyScript(MissingSeed, code="DDP025", name="missing-seed-any-script", severity="warning"):
    """## What it does
    DDP024 for the scripts it leaves out: a multi-GPU script that shows no care for
    reproducibility (no deterministic switch, no seed of any RNG, no seed option) and never seeds
    torch. Reported where the process group starts. Off by default: select it (or `ALL`) to ask
    every script for a seed.

    ## Why is this bad?
    The run is correct (DDP broadcasts rank 0's weights), but no two runs initialise, shuffle,
    drop out or augment alike, so results can't be reproduced or compared run to run.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = DDP(Net().cuda(rank), device_ids=[rank])
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    seed_everything(0)  # random, numpy, torch and CUDA
    model = DDP(Net().cuda(rank), device_ids=[rank])
    ```

    ## Fix safety
    Unsafe: it adds a `seed_everything(seed)` helper after the imports (Python's `random`, numpy
    where the script imports it, torch and every GPU) and calls `seed_everything(0)` just before
    the model is built; runs then repeat, with other numbers than before.
    """

    message = "not reproducible: nothing seeds torch's RNG"
    default_enabled = False

    def in_scope(self, a) -> bool:
        return not seeding.looks_after_reproducibility(a)


_HEAD = """import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank):
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = DDP(nn.Linear(4, 2))

"""

MissingSeedAnyScript.VALID = (
    _HEAD.replace("    model =", "    torch.manual_seed(0)\n    model =") + "mp.spawn(worker, nprocs=2)\n",
    # a module whose process group another file's entry starts (and may seed before): not judged here
    "import torch.distributed as dist\n\n\ndef setup(rank, world_size):\n    dist.init_process_group('gloo', rank=rank, world_size=world_size)\n",
    # a script that cares is DDP024's
    _HEAD.replace("    model =", "    torch.backends.cudnn.deterministic = True\n    model =") + "mp.spawn(worker, nprocs=2)\n",
)
MissingSeedAnyScript.INVALID = (
    Invalid(_HEAD + "mp.spawn(worker, nprocs=2)\n", line=9,
            fixed=_HEAD.replace("from torch.nn.parallel import DistributedDataParallel as DDP\n",
                                "from torch.nn.parallel import DistributedDataParallel as DDP\nimport random\n\n\n"
                                "def seed_everything(seed):\n"
                                '    """Seed every random number generator alike on every rank."""\n'
                                "    random.seed(seed)\n    torch.manual_seed(seed)\n    torch.cuda.manual_seed_all(seed)\n")
            .replace("    model =", "    seed_everything(0)\n    model =") + "mp.spawn(worker, nprocs=2)\n"),
)
