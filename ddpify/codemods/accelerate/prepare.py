"""`accelerator.prepare(...)`: the trained models, their optimizers and the training loaders.

prepare wraps each model for the launch (DistributedDataParallel on several processes), its
optimizer for mixed precision and gradient accumulation, and gives each training loader this
process's share of the batches, on its device. The objects a block builds are prepared together,
right after the last of them is built (a model after it reaches its device): `model, optimizer,
loader = accelerator.prepare(model, optimizer, loader)`. Evaluation loaders stay whole (every
process evaluates the whole set, as the original), and schedulers stay as they are: a prepared
scheduler steps once per process on every optimizer step, which changes the script's schedule.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import LoaderSite, ModelSite
from ddpify.anatomy.distributed.names import SYNC_BATCHNORM_CONVERT
from ddpify.anatomy.vocabulary import MODEL_CONTAINERS
from ddpify.codemods.accelerate.runtime import PREPARE
from ddpify.codemods.base import Transform
from ddpify.codemods.containers import wrap_each
from ddpify.codemods.duties import data_line, wrap_duty
from ddpify.edits.expressions import parse_expr, sync_batchnorm_of

NOT_SHARDED = "the training data is not sharded (found no training DataLoader to prepare): every process trains on all of it"


class PrepareForAccelerator(Transform):
    """Hand the trained models, their optimizers and the training loaders to accelerator.prepare."""

    NAME = "prepare"
    SEES_EDITS_OF = ()
    DUTY = wrap_duty("accelerator.prepare", "on its device", f"model = {PREPARE}(model)")

    def plan(self) -> None:
        self._groups: dict[tuple[int, str], list[tuple[ast.stmt, str]]] = {}
        models = self.models_to_wrap("accelerator.prepare")
        for model in models:
            self._prepare_model(model)
        if self._groups:
            for optimizer in self.anatomy.optimizers:
                self._prepare_bound(optimizer.stmt, optimizer.node, "optimizer")
            self.fulfil()
        loaders = [loader for loader in self.anatomy.train_loaders if self._prepare_loader(loader)]
        if not loaders and not self.anatomy.facts.data_loaded_elsewhere and not self.report.missing:
            self.missing(data_line(self.anatomy), NOT_SHARDED, f"hand the training DataLoader to {PREPARE}(...) by hand")
        for group in self._groups.values():
            self._insert_prepare(group)

    def _prepare_model(self, model: ModelSite) -> None:
        name = model.target.name
        if model.class_name in MODEL_CONTAINERS:
            self.missing(model.line, f"{name} is an nn.{model.class_name.rsplit('.', 1)[-1]}: it has no forward, so the step calls "
                                     "its modules by index, past any wrapper, and no process would sync their gradients",
                         f"prepare each module of {name} that the step calls, or hold them in a module whose forward runs them")
            return
        anchor = model.placements[-1] if model.placements else model.stmt
        if model.container:
            self.insert_after(anchor, wrap_each(name, model.container, lambda net: f"{PREPARE}({net})"))
            self.changed(anchor.lineno, f"each model in {name} prepared by {PREPARE}")
            return
        if model.has_batchnorm is not False:
            self.insert_after(anchor, _sync_batchnorm_on_gpu(name))
            self.changed(anchor.lineno, f"BatchNorm layers in {name} -> SyncBatchNorm when on GPU")
        self._add(anchor, name)

    def _prepare_bound(self, stmt: ast.stmt, value: ast.AST, what: str) -> bool:
        """Prepare what `stmt` binds to one name (`optimizer = SGD(...)`); False where it binds no such name."""
        if not (isinstance(stmt, ast.Assign) and stmt.value is value and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], (ast.Name, ast.Attribute))):
            self.advise(stmt.lineno, f"this {what} is not bound to a name: hand it to {PREPARE}(...) by hand")
            return False
        self._add(stmt, ast.unparse(stmt.targets[0]))
        return True

    def _prepare_loader(self, loader: LoaderSite) -> bool:
        if loader.built_elsewhere or loader.handled_elsewhere or loader.call is None:
            return False
        name = loader.target.name if loader.target is not None else None
        if name is None or not isinstance(loader.stmt, ast.Assign) or ast.unparse(loader.stmt.targets[0]) != name:
            self.missing(loader.line, "training loader not prepared (it is not bound to a name): every process trains on all of its data",
                         f"bind it to a variable and hand it to {PREPARE}(...) by hand")
            return False
        self._add(loader.stmt, name)
        self.changed(loader.line, f"training loader prepared: each process draws its own share of the batches, on its device")
        return True

    def _add(self, anchor: ast.stmt, name: str) -> None:
        parent, block, _ = self.anatomy.place_of(anchor)
        group = self._groups.setdefault((id(parent), block), [])
        if name not in [n for _, n in group]:
            group.append((anchor, name))

    def _insert_prepare(self, group: list[tuple[ast.stmt, str]]) -> None:
        """`a, b = accelerator.prepare(a, b)` after the last statement of the block that builds one of them."""
        last = max((anchor for anchor, _ in group), key=lambda stmt: self.anatomy.place_of(stmt)[2])
        names = ", ".join(name for _, name in group)
        self.insert_after(last, f"{names} = {PREPARE}({names})\n")
        self.changed(last.lineno, f"{names} prepared by {PREPARE}")


def _sync_batchnorm_on_gpu(name: str) -> str:
    """`model`'s BatchNorm layers made SyncBatchNorm where it runs on a GPU (SyncBatchNorm runs on GPUs only)."""
    converted = cst.Module([]).code_for_node(sync_batchnorm_of(parse_expr(name), SYNC_BATCHNORM_CONVERT))
    return f"if next({name}.parameters()).is_cuda:  # SyncBatchNorm runs on GPUs only\n    {name} = {converted}\n"
