"""Transforms 3 and 4: nn.DataParallel out; SyncBatchNorm where the model has BatchNorm, then the DDP wrapper.

A DataParallel wrap is removed first (DDP never wraps DataParallel: each rank would spread over
every visible GPU). The wrapper goes right after the model's parameters are final: after the statement
that binds it, or after the last statement of that block that moves it (`model.to(device)`,
`if ...: model.cuda()`) or casts it (`model.double()`: DDP builds its gradient buckets in the dtype it
finds), or inside the class it is handed to when that class moves it. A cast that training still
follows past that point (in the training loop) leaves the conversion incomplete (not under FSDP2,
whose shards follow it). Its options are chosen from the analysis, each with a comment in the
output saying why (ddp_options).
"""

from __future__ import annotations

import ast
from typing import Sequence

import libcst as cst

from ddpify.anatomy import DP_WRAPPER, ModelSite, syntax
from ddpify.anatomy.ddp_options import buffers_need_no_broadcast, compiled_where_bound, shares_parameters, writes_gradients
from ddpify.anatomy.distributed.names import SYNC_BATCHNORM_CONVERT
from ddpify.anatomy.distributed.wraps_made import PendingWrap
from ddpify.anatomy.owned_optimizers import owned_optimizers
from ddpify.anatomy.unused_parameters import may_leave_parameters_unused
from ddpify.anatomy.vocabulary import MODEL_CONTAINERS
from ddpify.codemods.base import Transform
from ddpify.codemods.containers import wrap_each
from ddpify.codemods.ddp.runtime import LOCAL_RANK
from ddpify.codemods.duties import wrap_duty
from ddpify.edits.expressions import parse_expr, sync_batchnorm_of


# DistributedDataParallel's options the analysis may choose, each with the reason its comment gives.
UNUSED_PARAMETERS = ("find_unused_parameters=True", "a backward may leave some of this model's parameters without a gradient")
GRADIENT_VIEWS = ("gradient_as_bucket_view=True", "gradients stay in the all-reduce buckets, uncopied (nothing here rebinds a .grad)")
NO_BUFFER_BROADCAST = ("broadcast_buffers=False", "this model's buffers are constants (no BatchNorm, none written in "
                                                "training): no copy from rank 0 before each forward")
COMPILE_AFTER = ("# ddpify: wrapped before torch.compile, the order the PyTorch docs give: the compiled\n"
                 "# model then overlaps the wrapper's gradient communication with its backward\n")


def option_comments(*options: tuple[str, str]) -> str:
    """A `# ddpify: option: why` line for each option."""
    return "".join(f"# ddpify: {option}: {why}\n" for option, why in options)


class RemoveDataParallel(Transform):
    """Take nn.DataParallel out: DDP replaces it (one process per GPU)."""

    NAME = "dataparallel"
    SEES_EDITS_OF = ()

    def plan(self) -> None:
        for site in self.anatomy.calls_to(DP_WRAPPER):
            call: ast.Call = site.node  # type: ignore[assignment]
            module = syntax.argument(call, 0, "module")
            if module is None:
                continue
            if self._rebinds_itself(site.stmt, call, module):
                self._remove(site.stmt)
            else:
                self.rewrite_node(call, cst.Call, lambda _, code=ast.unparse(module): cst.parse_expression(code))
            self.changed(site.line, f"nn.DataParallel({ast.unparse(module)}) removed: DistributedDataParallel replaces it")

    def _rebinds_itself(self, stmt: ast.stmt, call: ast.Call, module: ast.AST) -> bool:
        """`model = nn.DataParallel(model)`: without the wrapper the statement does nothing."""
        return (
            isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1
            and self.anatomy.ref(stmt.targets[0]) is not None and self.anatomy.ref(stmt.targets[0]) == self.anatomy.ref(module)
        )

    def _remove(self, stmt: ast.stmt) -> None:
        alone = len(self.anatomy.block_of(stmt)) == 1
        self.rewrite_statement(stmt, lambda _: [cst.SimpleStatementLine([cst.Pass()])] if alone else [])


class WrapModel(Transform):
    """Wrap each trained model in DistributedDataParallel once it is on its device."""

    NAME = "wrap"
    SEES_EDITS_OF = ("dataparallel",)  # DataParallel calls gone, models rebound
    DUTY = wrap_duty("DistributedDataParallel", "on its device", "model = DDP(model, device_ids=[local_rank])")
    PLACES_THE_MODEL = False  # does the wrap move the model to this rank's device itself?
    WRAPS_BEFORE_COMPILE = True  # wrap a model compiled where it is bound before the compile (DDP's order)
    CAST_AFTER_WRAP_BREAKS = True  # does a dtype cast after the wrap leave gradients reduced in the old dtype (DDP's buckets)?
    WRAPS_SEEN_AHEAD = True  # can the plans that read the wrapper see its wraps made (wraps_made), in the same stage?

    def plan(self) -> None:
        owned = owned_optimizers(self.anatomy)
        averaged = {optimizer.model for optimizer in owned}  # trained past their forward: averaged by hand
        models = [m for m in self.models_to_wrap("DistributedDataParallel", {o.built.node for o in owned}) if m not in averaged]
        if not models:
            return
        self.add_wrapper_import()
        for dp in self.anatomy.calls_to(DP_WRAPPER):
            self.missing(dp.line, "nn.DataParallel is still here: under DDP each rank would spread over every visible GPU",
                         "remove it (convert the single-GPU script)")
        for model in models:
            self._wrap(model)
        self.fulfil()

    def _wrap(self, model: ModelSite) -> None:
        name = model.target.name
        if model.class_name in MODEL_CONTAINERS:
            self.missing(model.line, f"{name} is an nn.{model.class_name.rsplit('.', 1)[-1]}: it has no forward, so the step calls its "
                                     "modules by index, past any wrapper, and no rank would sync their gradients",
                         f"wrap each module of {name} that the step calls, or hold them in a module whose forward runs them")
            return
        anchor = model.ready_at
        if model.container:
            self.insert_after(anchor, self._wrap_each(model, name))
            self.edits.wraps_unlisted = True
            self.changed(anchor.lineno, self.wrapped_message(f"each model in {name}"))
        elif self.WRAPS_BEFORE_COMPILE and compiled_where_bound(self.anatomy, model):
            code = self._sync_batchnorm(model, name, anchor.lineno) + COMPILE_AFTER + self.wrapper_code(model, name)
            self._insert_wrap(anchor, code, before=True)
            self.changed(anchor.lineno, self.wrapped_message(name) + " before torch.compile (the PyTorch docs' order)")
        else:
            self._insert_wrap(anchor, self._sync_batchnorm(model, name, anchor.lineno) + self.wrapper_code(model, name))
            self.changed(anchor.lineno, self.wrapped_message(name))
        if self.finds_unused(model):
            self.changed(anchor.lineno, f"find_unused_parameters=True: a backward may leave some of {name}'s parameters without a "
                                        "gradient (a branch of its forward, a layer it never calls, or outputs a step drops)")
        if not self.PLACES_THE_MODEL and not self.anatomy.moved_where_bound(model):
            self.advise(model.line, f"{name} is never moved to a GPU; the DDP script will train it on CPU (gloo)")
        if self.CAST_AFTER_WRAP_BREAKS:
            self._casts_after_wrap(model, name, anchor.lineno)

    def _insert_wrap(self, anchor: ast.stmt, code: str, before: bool = False) -> None:
        """Insert the statements that wrap a model next to `anchor`, listed for the plans that see them made."""
        (self.insert_before if before else self.insert_after)(anchor, code)
        if self.WRAPS_SEEN_AHEAD:
            self.edits.wraps.append(PendingWrap(anchor, code, before))
        else:
            self.edits.wraps_unlisted = True

    def _casts_after_wrap(self, model: ModelSite, name: str, wrapped_at: int) -> None:
        """A cast of the wrapped model that training follows: incomplete (no wrap can go after it)."""
        for cast in self.anatomy.casts_while_training(model):
            self.missing(cast.lineno, f"{ast.unparse(cast)} changes {name}'s parameters' dtype after it is wrapped (line {wrapped_at}), "
                                      "and training follows: the wrapper keeps communicating gradients in the dtype it was built for",
                         f"cast {name} once, before it is wrapped (where it is built), or leave its dtype alone while it trains")

    def _sync_batchnorm(self, model: ModelSite, name: str, line: int) -> str:
        if model.has_batchnorm is False:
            return ""
        which = "BatchNorm layers" if model.has_batchnorm else "any BatchNorm layers"
        self.changed(line, f"{which} in {name} -> SyncBatchNorm when on GPU")
        converted = cst.Module([]).code_for_node(sync_batchnorm_of(parse_expr(name), SYNC_BATCHNORM_CONVERT))
        return f"if next({name}.parameters()).is_cuda:  # SyncBatchNorm runs on GPUs only\n    {name} = {converted}\n"

    def _wrap_each(self, model: ModelSite, name: str) -> str:
        """`nets = {key: DDP(net, ...) for key, net in nets.items()}` (or a list comprehension)."""
        if model.has_batchnorm is not False:
            self.advise(model.line, f"the models in {name} may have BatchNorm layers: convert them with SyncBatchNorm by hand for GPUs")
        unused = self.finds_unused(model)
        return wrap_each(name, model.container, lambda net: self.wrap_expression(net, unused))  # type: ignore[arg-type]


    def add_wrapper_import(self) -> None:
        self.add_import("torch.nn.parallel", "DistributedDataParallel", "DDP")

    def wrap_expression(self, name: str, find_unused: bool = False, options: Sequence[str] = ()) -> str:
        """The expression that wraps the model `name` (its value replaces the model), with `options`."""
        chosen = ["find_unused_parameters=True"] if find_unused else []
        extra = "".join(f", {option}" for option in [*chosen, *options])
        return f"DDP({name}, device_ids=[{LOCAL_RANK}] if next({name}.parameters()).is_cuda else None{extra})"

    def wrapper_code(self, model: ModelSite, name: str) -> str:
        """The statements that wrap `name` once it is on its device: a comment for each option chosen, then the wrap."""
        options = self.ddp_options(model)
        return option_comments(*options) + f"{name} = {self.wrap_expression(name, options=[option for option, _ in options])}\n"

    def ddp_options(self, model: ModelSite) -> list[tuple[str, str]]:
        """(option, why) for each DistributedDataParallel option the analysis chooses for `model`."""
        gradient_views = not writes_gradients(self.anatomy) and not shares_parameters(self.anatomy, model)
        chosen = [(UNUSED_PARAMETERS, self.finds_unused(model)), (GRADIENT_VIEWS, gradient_views),
                  (NO_BUFFER_BROADCAST, buffers_need_no_broadcast(self.anatomy, model))]
        return [option for option, applies in chosen if applies]

    def finds_unused(self, model: ModelSite) -> bool:
        return may_leave_parameters_unused(self.anatomy, model)

    def wrapped_message(self, name: str) -> str:
        return f"wrapped {name} in DistributedDataParallel"
