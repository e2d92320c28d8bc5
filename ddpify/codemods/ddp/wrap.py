"""Transforms 3 and 4: SyncBatchNorm where the model has BatchNorm, then the DDP wrapper.

The wrapper goes right after the model reaches its device: after the statement that binds it,
or after the last statement of that block that moves it (`model.to(device)`, `if ...: model.cuda()`).
"""

from __future__ import annotations

import ast

from ddpify.anatomy import DP_WRAPPER, ModelSite
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import LOCAL_RANK


class WrapModel(Transform):
    NAME = "wrap"
    DESCRIPTION = "Wrap each trained model in DistributedDataParallel once it is on its device."

    def plan(self) -> None:
        models = self.anatomy.trained_models
        if not models:
            self.advise(1, "found no model that an optimizer trains; wrap it in DistributedDataParallel by hand")
            return
        self.add_import("torch.nn.parallel", "DistributedDataParallel", "DDP")
        for dp in self.anatomy.calls_to(DP_WRAPPER):
            self.advise(dp.line, "nn.DataParallel is still here: under DDP each rank would spread over every visible GPU; remove it (convert the single-GPU script)")
        for model in models:
            self._wrap(model)

    def _wrap(self, model: ModelSite) -> None:
        name = model.target.name
        anchor = model.placements[-1] if model.placements else model.stmt
        code = []
        if model.has_batchnorm is not False:
            code.append(
                f"if next({name}.parameters()).is_cuda:  # SyncBatchNorm runs on GPUs only\n"
                f"    {name} = torch.nn.SyncBatchNorm.convert_sync_batchnorm({name})\n"
            )
            which = "BatchNorm layers" if model.has_batchnorm else "any BatchNorm layers"
            self.changed(anchor.lineno, f"{which} in {name} -> SyncBatchNorm when on GPU")
        code.append(f"{name} = DDP({name}, device_ids=[{LOCAL_RANK}] if next({name}.parameters()).is_cuda else None)\n")
        self.insert_after(anchor, "".join(code))
        self.changed(anchor.lineno, f"wrapped {name} in DistributedDataParallel")
        if not model.placements and not _moved_in_binding(model):
            self.advise(model.line, f"{name} is never moved to a GPU; the DDP script will train it on CPU (gloo)")


def _moved_in_binding(model: ModelSite) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("to", "cuda")
        for n in ast.walk(model.node)
    )
