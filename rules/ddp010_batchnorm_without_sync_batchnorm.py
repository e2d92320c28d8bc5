"""DDP010: a model with BatchNorm wrapped in DDP without SyncBatchNorm conversion."""

from __future__ import annotations

import ast
import re

from ddpify.anatomy import ROLE_MODEL, syntax
from ddpify.anatomy.distributed.names import SYNC_BATCHNORM_CONVERT
from ddpify.anatomy.distributed.wrappers import model_origins, wrap_calls, wrapped_module
from ddpify.edits.expressions import sync_batchnorm_of
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit

# torchvision families built with BatchNorm layers
_TORCHVISION_BATCHNORM = re.compile(
    r"^torchvision\.models\.(resnet\d+|resnext\w+|wide_resnet\w+|densenet\d+|mobilenet_v[23]\w*|efficientnet_\w+"
    r"|regnet_\w+|inception_v3|googlenet|shufflenet_v2\w*|mnasnet\w+|vgg\d+_bn)$"
)


class BatchNormWithoutSyncBatchNorm(Rule, code="DDP010", name="batchnorm-without-sync-batchnorm", severity="warning"):
    """## What it does
    Flags a `DistributedDataParallel(model)` call when the model has BatchNorm layers (a model
    class of this file that builds `nn.BatchNorm*d`, an `nn.BatchNorm*d` itself, or a torchvision
    model known to use BatchNorm) and the script never calls
    `nn.SyncBatchNorm.convert_sync_batchnorm`.

    ## Why is this bad?
    Each rank normalises with the mean and variance of its own per-GPU batch, which is
    world-size times smaller than the global batch: noisier statistics than the single-GPU run,
    worse with small per-GPU batches (detection, segmentation). The running statistics are not
    averaged either: DDP overwrites every rank's with rank 0's at each forward, so the saved
    statistics come from rank 0's shard only. `SyncBatchNorm` computes them over all ranks.

    This is a warning, not an error: with large per-GPU batches plain BatchNorm is a common,
    deliberate choice (it is faster).

    ## Example
    ```python
    model = DDP(ResNetLike().to(rank), device_ids=[rank])
    ```

    ## Use instead
    ```python
    model = nn.SyncBatchNorm.convert_sync_batchnorm(ResNetLike()).to(rank)
    model = DDP(model, device_ids=[rank])
    ```

    ## Fix safety
    Unsafe: wraps the module passed to DDP in `nn.SyncBatchNorm.convert_sync_batchnorm(...)`.
    That changes the training numerics, costs a collective per BatchNorm layer and forward, and
    SyncBatchNorm needs CUDA tensors (it fails on CPU/gloo runs).
    """

    message = "model with BatchNorm wrapped in DDP without SyncBatchNorm: each rank normalises over its own small batch"

    def check(self, a):
        if a.calls_to(SYNC_BATCHNORM_CONVERT):
            return
        for site in wrap_calls(a):
            inner = wrapped_module(site.node)  # type: ignore[arg-type]
            origins = model_origins(a, inner) if inner is not None else None
            if origins and any(_has_batchnorm(a, o) for o in origins):
                yield Finding(site.pos, fix=_fix(a, inner))


def _has_batchnorm(a, constructor: ast.Call) -> bool:
    if any(getattr(site, "has_batchnorm", False) for site in a.origins(constructor, ROLE_MODEL)):
        return True
    return bool(_TORCHVISION_BATCHNORM.match(a.qualname(constructor.func) or ""))


def _fix(a, inner: ast.AST) -> Fix | None:
    """Wrap the module passed to DDP in the conversion convert writes (`sync_batchnorm_of`)."""
    convert = syntax.spelling(a, SYNC_BATCHNORM_CONVERT)
    edit = expression_edit(a, inner, lambda module: sync_batchnorm_of(module, convert)) if convert else None
    return Fix((edit,), safe=False, description="convert BatchNorm layers to SyncBatchNorm") if edit else None


_HEAD = """import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x))


dist.init_process_group("nccl")
"""

BatchNormWithoutSyncBatchNorm.VALID = (
    _HEAD + "model = nn.SyncBatchNorm.convert_sync_batchnorm(ConvNet()).cuda()\nmodel = DDP(model)\n",
    _HEAD + "model = DDP(nn.Linear(4, 2).cuda())\n",
)
BatchNormWithoutSyncBatchNorm.INVALID = (
    Invalid.fixed_by(
        _HEAD + "model = ConvNet().cuda()\nmodel = DDP(model, device_ids=[0])\n",
        old="DDP(model,", new="DDP(nn.SyncBatchNorm.convert_sync_batchnorm(model),",
    ),
    Invalid(
        "import torch.distributed as dist\nimport torchvision\nfrom torch.nn.parallel import DistributedDataParallel\n"
        "dist.init_process_group('nccl')\nmodel = DistributedDataParallel(torchvision.models.resnet18().cuda())\n",
        line=5,
    ),
)
