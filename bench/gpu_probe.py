"""Run a training script the way `python SCRIPT ARGS...` would, and record what it did on the GPU.

    python bench/gpu_probe.py [--share-gpu] OUTDIR SCRIPT [ARGS...]

Works as a torchrun worker or as a plain process. Before the script starts it wraps
`init_process_group`, DistributedDataParallel, DataParallel, SyncBatchNorm, autocast and
GradScaler to note the backend, where the wrapped module's parameters live, the device_ids,
SyncBatchNorm calls, autocast dtypes and the GradScaler's state. When the script ends (or
dies) it writes OUTDIR/probe-<RANK>.json. The script itself runs unmodified, teardown included.

--share-gpu puts every rank on GPU 0 with gloo (NCCL refuses two ranks on one GPU), the way
`ddpify verify --device cuda` does when there are more ranks than GPUs.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DataParallel, DistributedDataParallel

FACTS: dict = {"wrappers": [], "backend": None, "sync_bn_calls": 0, "autocast": [], "scaler": None,
               "error": None}


def module_facts(kind: str, module: torch.nn.Module, device_ids) -> dict:
    """Where a wrapped module lives and which BatchNorm flavours it holds."""
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm)]
    return {"kind": kind, "device_ids": None if device_ids is None else [str(d) for d in device_ids],
            "param_devices": sorted({str(p.device) for p in module.parameters()}),
            "sync_bn": sum(isinstance(m, torch.nn.SyncBatchNorm) for m in norms),
            "plain_bn": sum(not isinstance(m, torch.nn.SyncBatchNorm) for m in norms)}


def watch_process_group() -> None:
    init = dist.init_process_group

    def recorded(*args, **kwargs):
        result = init(*args, **kwargs)
        FACTS["backend"] = str(dist.get_backend())
        return result

    dist.init_process_group = recorded


def watch_wrappers() -> None:
    ddp_init = DistributedDataParallel.__init__
    dp_init = DataParallel.__init__

    def ddp(self, module, *args, **kwargs):
        ddp_init(self, module, *args, **kwargs)
        FACTS["wrappers"].append(module_facts("DDP", module, self.device_ids))

    def dp(self, module, *args, **kwargs):
        dp_init(self, module, *args, **kwargs)
        FACTS["wrappers"].append(module_facts("DP", module, self.device_ids))

    DistributedDataParallel.__init__ = ddp
    DataParallel.__init__ = dp


def watch_sync_batchnorm() -> None:
    forward = torch.nn.SyncBatchNorm.forward

    def counted(self, input):
        if self.training:
            FACTS["sync_bn_calls"] += 1
        return forward(self, input)

    torch.nn.SyncBatchNorm.forward = counted


def watch_mixed_precision() -> None:
    enter = torch.autocast.__enter__
    step = torch.amp.GradScaler.step

    def entered(self):
        seen = {"device": self.device, "dtype": str(self.fast_dtype), "enabled": bool(self._enabled)}
        if seen not in FACTS["autocast"]:
            FACTS["autocast"].append(seen)
        return enter(self)

    def stepped(self, optimizer, *args, **kwargs):
        result = step(self, optimizer, *args, **kwargs)
        FACTS["scaler"] = {"enabled": self.is_enabled(), "scale": self.get_scale() if self.is_enabled() else None}
        return result

    torch.autocast.__enter__ = entered
    torch.amp.GradScaler.step = stepped


def share_gpu() -> None:
    """Every rank on GPU 0 with gloo: verify's own single-GPU sharing."""
    from ddpify.verify.harness import share_single_gpu

    share_single_gpu()


def write_facts(outdir: str) -> None:
    if torch.cuda.is_initialized():
        FACTS["max_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    path = os.path.join(outdir, f"probe-{os.environ.get('RANK', '0')}.json")
    with open(path, "w") as f:
        json.dump(FACTS, f, indent=1)


def main(argv: list[str]) -> int:
    share = argv[:1] == ["--share-gpu"]
    outdir, script, *args = argv[1:] if share else argv
    if share:
        share_gpu()
    watch_process_group()
    watch_wrappers()
    watch_sync_batchnorm()
    watch_mixed_precision()
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:
        FACTS["error"] = traceback.format_exc().strip().splitlines()[-1]
        traceback.print_exc()
        code = 1
    write_facts(outdir)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
