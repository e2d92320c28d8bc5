"""`accelerator.prepare(...)`: the trained models, their optimizers and the training loaders.

prepare wraps each model for the launch (DistributedDataParallel on several processes, moved to
this process's device), its optimizer for mixed precision, and gives each training loader this
process's share of the batches, on its device. The models are found and readied as the DDP wrap
finds them (ddpify.codemods.ddp.wrap: SyncBatchNorm on GPUs, each model of a dict or list); the
objects a block builds are prepared together, right after the last of them is built (a model once
it is on its device): `model, optimizer, loader = accelerator.prepare(model, optimizer, loader)`.
A freshly prepared loader starts at its epoch 0 (its seedable sampler shuffles with torch's initial seed plus
the epoch): one built anew inside an epoch loop is told the loop's epoch after each prepare,
`loader.set_epoch(epoch)`, so that every epoch reshuffles as the original's does (one built inline in the pass,
`for b in DataLoader(...)`, is first named: `train_loader = accelerator.prepare(DataLoader(...))`).
Evaluation loaders are evaluation.py's to prepare (where their rows can be gathered), and
schedulers stay as they are: a prepared scheduler steps once per process on every optimizer step,
which changes the script's schedule.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import Anatomy, LoaderSite, LoopSite, ModelSite
from ddpify.anatomy.distributed.randomness import batches_each_rank_draws
from ddpify.anatomy.environments import trains_on_environment
from ddpify.anatomy.full_batch import trains_without_loader
from ddpify.codemods.accelerate.runtime import PREPARE
from ddpify.codemods.ddp.wrap import WrapModel
from ddpify.codemods.duties import data_line, wrap_duty
from ddpify.edits.expressions import parse_expr

NOT_SHARDED = "the training data is not sharded (found no training DataLoader to prepare): every process trains on all of it"


class PrepareForAccelerator(WrapModel):
    """Hand the trained models, their optimizers and the training loaders to accelerator.prepare."""

    NAME = "prepare"
    DUTY = wrap_duty("accelerator.prepare", "on its device", f"model = {PREPARE}(model)")
    PLACES_THE_MODEL = True
    WRAPS_SEEN_AHEAD = False  # its calls are no DDP rebinding: the plans reading the model wait for them

    def plan(self) -> None:
        self._groups: dict[tuple[int, str], list[tuple[ast.stmt, str]]] = {}
        self._epochs: dict[str, str] = {}  # a loader built inside an epoch loop -> the loop's epoch variable
        self._names_taken: set[str] = set()
        super().plan()  # each model: wrapper_code() puts it in its block's group
        if self._groups:
            for optimizer in self.anatomy.optimizers:
                self._prepare_bound(optimizer.stmt, optimizer.node, "optimizer")
        loaders = [loader for loader in self.anatomy.train_loaders if self._prepare_loader(loader)]
        loaders += [loader for loader in returned_training_loaders(self.anatomy) if self._prepare_returned(loader)]
        if not loaders and not self._prepared_elsewhere() and not self.report.missing:
            self.missing(data_line(self.anatomy), NOT_SHARDED, f"hand the training DataLoader to {PREPARE}(...) by hand")
        for group in self._groups.values():
            self._insert_prepare(group)

    def add_wrapper_import(self) -> None:
        """prepare is a method of the Accelerator (ddpify.codemods.accelerate.setup imports it)."""

    def wrap_expression(self, name: str, find_unused: bool = False) -> str:
        return f"{PREPARE}({name})"  # find_unused_parameters goes to the Accelerator (setup)

    def wrapper_code(self, model: ModelSite, name: str) -> str:
        """Nothing here: the model joins the prepare call of its block."""
        self._add(model.ready_at, name)
        return ""

    def wrapped_message(self, name: str) -> str:
        return f"{name} wrapped by {PREPARE} (DistributedDataParallel on several processes)"

    def _prepared_elsewhere(self) -> bool:
        """Is the training data another file's to prepare (it iterates a loader of its own, or binds the
        loaders this file returns), or no loader's (the rows of each loss are shared: rows.py; batches
        drawn at random offsets, environments played: own_data.py)?"""
        a = self.anatomy
        return a.facts.data_loaded_elsewhere or any(self._returned_to_another_file(ld) for ld in a.train_loaders) \
            or trains_without_loader(a) or bool(batches_each_rank_draws(a)) or trains_on_environment(a)

    def _returned_to_another_file(self, loader: LoaderSite) -> bool:
        """Is the loader returned to another file, which trains on it (and prepares it where it binds it)?
        One this file hands to another file's function (`Trainer(model, build_loader())`) is prepared here."""
        return any(scope == loader.scope for scope, _ in self.anatomy.facts.trained_returns)

    def _prepare_bound(self, stmt: ast.stmt, value: ast.AST, what: str) -> None:
        """Prepare what `stmt` binds to one name (`optimizer = SGD(...)`)."""
        name = _bound_name(stmt, value)
        if name is None:
            self.advise(stmt.lineno, f"this {what} is not bound to a name: hand it to {PREPARE}(...) by hand")
            return
        self._add(stmt, name)

    def _prepare_returned(self, loader: LoaderSite) -> bool:
        """A training loader another file's function returns joins the prepare call where it is bound to a
        name here (`train_loader = get_train_loader()`, or an item of `train_loader, val_loader = get_loaders()`),
        and is prepared where it is made otherwise (`train(model, get_train_loader())`)."""
        name = _bound_name(loader.stmt, loader.call, loader.index)
        if name is not None:
            self._add(loader.stmt, name)
        elif loader.index is None:
            self._prepare_in_place(loader.call)
        else:
            self.missing(loader.line, "training loader not prepared: an item of what another file's function returns, bound to no name here",
                         f"bind it to a name and hand it to {PREPARE}(...) by hand")
            return False
        self.changed(loader.line, "training loader prepared: each process draws its own share of the batches, on its device")
        return True

    def _prepare_in_place(self, call: ast.Call) -> None:
        """`DataLoader(...)` -> `accelerator.prepare(DataLoader(...))` where it is built."""
        self.rewrite_node(call, cst.Call, lambda node: cst.Call(func=parse_expr(PREPARE), args=[cst.Arg(node)]))

    def _prepare_loader(self, loader: LoaderSite) -> bool:
        """A loader bound to a name joins its block's prepare call; one built in an expression (a helper's
        `return DataLoader(...)`, `for x in DataLoader(...)`) is prepared where it is built."""
        if loader.built_elsewhere or loader.call is None or self._returned_to_another_file(loader):
            return False
        name = loader.target.name if loader.target is not None else None
        if name is not None and isinstance(loader.stmt, ast.Assign) and ast.unparse(loader.stmt.targets[0]) == name:
            self._add(loader.stmt, name)
            self._reshuffle_each_epoch(loader, name)
        elif any(not loop.trains and loader in loop.loaders for loop in self.anatomy.step_loops):
            self.missing(loader.line, "training loader not prepared: this DataLoader call builds evaluation loaders too",
                         f"hand only the training loader to {PREPARE}(...) by hand")
            return False
        elif not self._named_before_pass(loader):
            self._prepare_in_place(loader.call)
        self.changed(loader.line, "training loader prepared: each process draws its own share of the batches, on its device")
        return True

    def _named_before_pass(self, loader: LoaderSite) -> bool:
        """`for b in DataLoader(...)` inside an epoch loop: the loader named, prepared and told the epoch right before
        the pass, which then takes it by its name; False where the loader is not built in what the pass iterates."""
        stmt, loop = loader.stmt, self._epoch_loop_building(loader)
        if loop is None or loop.loop_var is None or not isinstance(stmt, ast.For) \
                or not any(node is loader.call for node in ast.walk(stmt.iter)):
            return False
        name = self.fresh_name("train_loader", self._names_taken)
        self.rewrite_node(loader.call, cst.Call, lambda node: cst.Name(name))
        self.insert_before(stmt, f"{name} = {PREPARE}({ast.unparse(loader.call)})\n{name}.set_epoch({loop.loop_var})\n")
        self.changed(loader.line, f"the loader built for each epoch named {name}; {name}.set_epoch({loop.loop_var}) after its prepare, "
                                  "so that it reshuffles each epoch as the original does")
        return True

    def _reshuffle_each_epoch(self, loader: LoaderSite, name: str) -> None:
        """A loader built inside an epoch loop is prepared anew every epoch, each time at epoch 0: have it told the
        loop's epoch after the prepare (_insert_prepare), or say why it can't be."""
        loop = self._epoch_loop_building(loader)
        if loop is None:
            return
        if loop.loop_var is None:
            self.advise(loader.line, f"this loader is prepared anew every epoch, each time at epoch 0: call {name}.set_epoch(epoch) "
                                     "after its prepare by hand (the epoch loop has no epoch variable), or every epoch repeats one shuffle")
            return
        self._epochs[name] = loop.loop_var

    def _epoch_loop_building(self, loader: LoaderSite) -> LoopSite | None:
        """The innermost epoch loop around the loader's training that builds it anew every epoch."""
        loops = [loop for loop in self.anatomy.epoch_loops_around(loader) if any(n is loader.stmt for n in ast.walk(loop.node))]
        return max(loops, key=lambda found: found.line, default=None)

    def _add(self, anchor: ast.stmt, name: str) -> None:
        parent, block, _ = self.anatomy.place_of(anchor)
        group = self._groups.setdefault((id(parent), block), [])
        if name not in [n for _, n in group]:
            group.append((anchor, name))

    def _insert_prepare(self, group: list[tuple[ast.stmt, str]]) -> None:
        """`a, b = accelerator.prepare(a, b)` after the last statement of the block that builds one of them;
        where the block trains before the last is built (a teacher trained before its student), what is built
        by then is prepared before that training, the rest after."""
        block = self.anatomy.block_of(group[0][0])
        cuts = [index for index in range(1, len(block)) if self._trains(block[index])]
        batches: dict[int, list[tuple[ast.stmt, str]]] = {}
        for anchor, name in group:  # in the group's order: models, optimizers, loaders
            batches.setdefault(sum(cut < block.index(anchor) for cut in cuts), []).append((anchor, name))
        for batch in batches.values():
            last = max((anchor for anchor, _ in batch), key=block.index)
            names = ", ".join(name for _, name in batch)
            told = "".join(f"{name}.set_epoch({self._epochs[name]})\n" for _, name in batch if name in self._epochs)
            self.insert_after(last, f"{names} = {PREPARE}({names})\n{told}")
            self.changed(last.lineno, f"{names} = {PREPARE}({names}), after the last of them is built")
            for _, name in batch:
                if name in self._epochs:
                    self.changed(last.lineno, f"{name}.set_epoch({self._epochs[name]}) after its prepare: prepared anew every "
                                              "epoch, it reshuffles each epoch as the original does")

    def _trains(self, stmt: ast.stmt) -> bool:
        """Does the statement run a training step (a backward or an optimizer step)?"""
        steps = {site.node for site in self.anatomy.training_calls}
        return any(node in steps for node in ast.walk(stmt))


def returned_training_loaders(anatomy: Anatomy) -> list[LoaderSite]:
    """The training loaders that calls of another file's functions return here."""
    return [loader for loader in anatomy.foreign_loaders if loader.is_train and loader.call is not None]


def _bound_name(stmt: ast.stmt, value: ast.AST, index: int | None = None) -> str | None:
    """The one name `stmt` binds `value` to (`name = value`), or item `index` of it (`a, b = value`)."""
    if not (isinstance(stmt, ast.Assign) and stmt.value is value and len(stmt.targets) == 1):
        return None
    target = stmt.targets[0]
    if index is not None:
        items = target.elts if isinstance(target, (ast.Tuple, ast.List)) else []
        target = items[index] if index < len(items) else None
    return ast.unparse(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
