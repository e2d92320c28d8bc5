"""DDP014: CUDA_VISIBLE_DEVICES set after torch is imported."""

from __future__ import annotations

import ast

from ddpify.anatomy import MODULE_SCOPE
from ddpify.anatomy.distributed.launch import env_writes
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule


class CudaVisibleDevicesAfterTorchImport(
    Rule, code="DDP014", name="cuda-visible-devices-after-torch-import", severity="error"
):
    """## What it does
    Flags `os.environ["CUDA_VISIBLE_DEVICES"] = ...` (and `os.environ.setdefault`/`update`,
    `os.putenv`) that runs after `import torch`: further down the module, or in any function.

    ## Why is this bad?
    CUDA reads the variable once, when it initialises in the process. Any CUDA call before the
    assignment — `torch.cuda.is_available()`, `torch.cuda.device_count()`, a tensor moved to the
    GPU, a library that probes the GPU at import — has already fixed the visible
    devices, and the assignment is silently ignored: every rank then sees all GPUs and, typically,
    all of them use GPU 0 (out of memory, or NCCL errors about duplicate GPUs). Whether it works
    depends on call order far from the line, so even a version that works today is fragile. In a
    DDP script, pick the device with `torch.cuda.set_device(local_rank)` instead, or set the
    variable in the launching shell.

    ## Example
    ```python
    import os
    import torch

    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LOCAL_RANK"]
    ```

    ## Use instead
    ```python
    import os
    import torch

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    ```

    ## Fix safety
    No fix: moving the assignment above the imports, or replacing it with `set_device`, changes
    which devices the rest of the script numbers from 0.
    """

    message = "CUDA_VISIBLE_DEVICES set after `import torch`: ignored once CUDA has initialised"

    def check(self, a):
        first_import = _first_torch_import_line(a)
        if first_import is None:
            return
        for node in env_writes(a, "CUDA_VISIBLE_DEVICES"):
            in_function = syntax.enclosing_function(a, node) != MODULE_SCOPE
            if in_function or node.lineno > first_import:  # type: ignore[attr-defined]
                yield Finding(a.pos(a.stmt_of.get(node, node)))


def _first_torch_import_line(a) -> int | None:
    lines = [
        n.lineno
        for n in a.tree.body
        if (isinstance(n, ast.Import) and any(al.name.split(".")[0] == "torch" for al in n.names))
        or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch")
    ]
    return min(lines, default=None)


CudaVisibleDevicesAfterTorchImport.VALID = (
    """import os

os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
""",
    """import os
import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
""",
)
CudaVisibleDevicesAfterTorchImport.INVALID = (
    Invalid(
        """import os
import torch
import torch.distributed as dist

os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LOCAL_RANK"]
dist.init_process_group("nccl")
""",
        line=5,
    ),
    Invalid(
        """import os
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size):
    os.environ.update({"CUDA_VISIBLE_DEVICES": str(rank)})
    dist.init_process_group("nccl", rank=rank, world_size=world_size)


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
""",
        line=7,
    ),
)
