"""DP007: nn.DataParallel where DistributedDataParallel is recommended (off by default)."""

from __future__ import annotations

from ddpify.anatomy import DP_WRAPPER
from ddpify.lint import Finding, Invalid, Rule


class PreferDDP(Rule, code="DP007", name="prefer-ddp", severity="info"):
    """## What it does
    Reports every `nn.DataParallel(...)`. Off by default; turn it on with `extend-select = ["DP007"]`.

    ## Why is this bad?
    DataParallel is one process with a thread per GPU: every step it copies the weights from the
    first GPU to the others, scatters the batch, and gathers the outputs back on the first GPU,
    which also computes the loss for everyone. The Python interpreter lock and that first GPU become
    the bottleneck, and its memory fills first. PyTorch recommends `DistributedDataParallel` (one
    process per GPU) even on a single machine; it is faster and also scales to several machines.

    ## Example
    ```python
    model = nn.DataParallel(Net().cuda())
    ```

    ## Use instead
    ```python
    # torchrun --nproc-per-node=4 train.py   (`ddpify convert train.py --to ddp` writes the rest)
    model = DDP(Net().to(local_rank), device_ids=[local_rank])
    ```

    ## Fix safety
    No fix: moving to DDP changes how the script is launched; `ddpify convert --to ddp` on the
    single-GPU version of the script does it.
    """

    message = "nn.DataParallel is slower than DistributedDataParallel, even on one machine; consider DDP"
    default_enabled = False

    def check(self, anatomy):
        for wrap in anatomy.calls_to(DP_WRAPPER):
            yield Finding(wrap.pos)


PreferDDP.VALID = ("import torch\nmodel = torch.nn.Linear(4, 2)\n",)
PreferDDP.INVALID = (Invalid("import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(4, 2))\n", line=2),)
