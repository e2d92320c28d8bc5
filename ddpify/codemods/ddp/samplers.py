"""Transforms 5 and 9: DistributedSampler on training loaders, set_epoch each epoch, batch size.

Each training DataLoader gets `sampler=DistributedSampler(dataset, shuffle=..., seed=..., drop_last=...)`
(its own `shuffle` moves into the sampler), and every epoch loop that trains on it calls
`<loader>.sampler.set_epoch(epoch)` first, so each epoch shuffles differently and all ranks agree
(after the loader where the loop builds it anew; none where its sampler never shuffles). A loader
built right where the pass takes it (`for b in DataLoader(ds, shuffle=True):`) is named first, with
its sampler, and stays built each epoch, as its arguments may change per epoch. A batch size and
shuffle passed by position are read as such; a sampler passed by position leaves it to the user. Loaders
a variable gets in the branches of an if/elif/else are each sharded: any may be the one trained on.
Evaluation loaders are sharded by the evaluation transform (evaluation.py), or left whole.
"""

from __future__ import annotations

import ast
from typing import Callable, Sequence

import libcst as cst

from ddpify.anatomy import ADAPTIVE_OPTIMIZERS, ROLE_LOADER, ROLE_OPTIMIZER, ROLE_PBAR, LoaderSite, LoopSite
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.distributed.reaching import is_iterable_dataset
from ddpify.anatomy.distributed.names import TORCH
from ddpify.anatomy.distributed.samplers import sampler_with_replacement
from ddpify.anatomy.syntax import argument
from ddpify.anatomy.vocabulary import ITERATION_WRAPPERS
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import WORLD_SIZE
from ddpify.codemods.ddp.noise import rank_seed
from ddpify.codemods.duties import Duty, data_line
from ddpify.edits.expressions import cst_type_of, parse_expr

_TIGHT_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
_PER_GPU_NOTE = f"# ddpify: batch_size per process; global = batch_size * {WORLD_SIZE}"
_GLOBAL_NOTE = f"# ddpify: the global batch is split over {WORLD_SIZE} processes."


class SamplerTransform(Transform):
    """What the transforms that hand a DataLoader a sampler share: naming its dataset, editing the call."""

    def plan(self) -> None:
        self._names_taken: set[str] = set()

    def _dataset_code(self, dataset: ast.AST, base: str = "train_dataset") -> str:
        """The dataset to hand the sampler: a dataset built inline is bound with `:=` so it is built once."""
        if isinstance(dataset, (ast.Name, ast.Attribute)):
            return ast.unparse(dataset)
        name = self._fresh_name(base)
        keyword = not isinstance(self.anatomy.parents.get(dataset), ast.Call) or dataset not in self.anatomy.parents[dataset].args  # type: ignore[attr-defined]
        self.rewrite_node(dataset, cst_type_of(dataset) or cst.Call, lambda node: _bind(node, name, keyword))
        return name

    def _fresh_name(self, base: str) -> str:
        return self.fresh_name(base, self._names_taken)

    def _with_sampler(self, node: cst.CSTNode, sampler: str, divide_batch: bool = False) -> cst.CSTNode:
        """The call with `sampler=...` where `shuffle=` was (or appended), keeping its layout."""
        assert isinstance(node, cst.Call)
        new_arg = cst.Arg(keyword=cst.Name("sampler"), value=parse_expr(sampler), equal=_TIGHT_EQUAL)
        args = list(node.args)
        shuffle = _argument_index(args, "shuffle", _LOADER_POSITIONS.index("shuffle"))
        splat = next((i for i, a in enumerate(args) if a.star == "**"), None)
        if shuffle is not None:
            args[shuffle] = new_arg.with_changes(comma=args[shuffle].comma)
        elif splat is not None:  # before the ** dict, so its shuffle is popped before it is unpacked
            args.insert(splat, new_arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
        else:
            last = args[-1]
            separator = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            args[-1] = last.with_changes(comma=separator)
            args.append(new_arg.with_changes(comma=last.comma))
        return node.with_changes(args=_divided_batch(args) if divide_batch else args)


class DistributedSamplers(SamplerTransform):
    """Shard training loaders with DistributedSampler and reshuffle every epoch."""

    NAME = "sampler"
    SEES_EDITS_OF = ()
    DUTY = Duty(
        "the training data is not sharded (found no DataLoader that a training loop iterates): every rank trains on all of it",
        "give the training DataLoader sampler=DistributedSampler(dataset) and call sampler.set_epoch(epoch) every epoch, or slice the data by rank",
        data_line,
    )

    def plan(self) -> None:
        super().plan()
        self._queued: set[tuple[ast.stmt, str]] = set()
        self._noted: set[ast.stmt] = set()
        self._drawn_apart = False
        self._sharded_calls: dict[ast.Call, Callable[[cst.CSTNode], cst.CSTNode]] = {}
        self._named_calls: set[ast.Call] = set()
        sharded = [ld for ld in self.anatomy.train_loaders if self._shard(ld)]
        if sharded:
            self.add_import("torch.utils.data", "DistributedSampler")
        if sharded or self._drawn_apart:
            self.fulfil()
            advise_learning_rate(self)
        foreign = [ld for ld in self.anatomy.foreign_loaders if ld.is_train]  # the file that builds it shards it
        if foreign or self.anatomy.facts.data_loaded_elsewhere:
            self.fulfil()
        sharded += foreign
        with_set_epoch = {ld for loop in self.anatomy.epoch_loops for ld in self._set_epoch(loop, sharded)}
        with_set_epoch |= self._next_epoch_at_restarts(sharded)
        for loader in sharded:
            if loader not in with_set_epoch and not loader.handled_elsewhere and not self._passes_numbered(loader):
                self._missing_set_epoch(loader.line, "found no `for epoch in ...` loop around this loader")
        iterated = {loader for loop in (*self.anatomy.step_loops, *self.anatomy.delegated_steps) for loader in loop.loaders}
        iterated |= {loader for _, loader, _ in self.anatomy.iterator_passes}
        for loader in self.anatomy.loaders:
            if loader.handled_elsewhere:
                continue  # advice about it belongs to the file that iterates it
            if loader not in iterated:
                self.advise(loader.line, "loader not iterated by a for loop (next(iter(...))?); if it feeds training, shard it with DistributedSampler by hand")

    # ----- the loader call ---------------------------------------------------------------------
    def _shard(self, loader: LoaderSite) -> bool:
        call = loader.call
        if self._also_evaluates(loader):
            self._missing_sampler(loader.line, "this DataLoader call builds training and evaluation loaders alike",
                                  "shard only the training one (DistributedSampler) by hand")
            return False
        if len(call.args) > len(_LOADER_POSITIONS):
            self._missing_sampler(loader.line, "the training loader's sampler options are passed by position",
                                  "pass them by keyword, or add a DistributedSampler by hand")
            return False
        keywords = {kw.arg: kw.value for kw in call.keywords if kw.arg}
        keywords.update(zip(_LOADER_POSITIONS[1:], call.args[1:]))
        drawn = sampler_with_replacement(self.anatomy, keywords["sampler"]) if "sampler" in keywords else None
        if drawn is not None:
            self._draw_apart(loader, drawn)
            return False
        if "sampler" in keywords or "batch_sampler" in keywords:
            self._missing_sampler(loader.line, "the training loader has its own sampler", "shard it across ranks by hand")
            return False
        dataset = call.args[0] if call.args else keywords.get("dataset")
        if dataset is None:
            self._missing_sampler(loader.line, "can't tell the training loader's dataset", "add a DistributedSampler by hand")
            return False
        if is_iterable_dataset(self.anatomy, dataset):
            self._missing_sampler(loader.line, "the training data is an IterableDataset, and a DataLoader takes no sampler for it",
                                  "shard it in its __iter__ by hand (every WORLD_SIZE-th sample, starting at RANK)")
            return False
        splats = [kw.value for kw in call.keywords if kw.arg is None]
        sampler = f"DistributedSampler({self._dataset_code(dataset)}{self._sampler_options(keywords, splats)})"
        self._sharded_calls[call] = lambda node: self._with_sampler(node, sampler, self.options.batch_size == "global")
        self.rewrite_node(call, cst.Call, self._sharded_calls[call])
        if loader.stmt not in self._noted:  # one note for the loaders of one statement (`A if c else B`)
            self._noted.add(loader.stmt)
            self.rewrite_statement(loader.stmt, self._with_batch_note)
        self.changed(loader.line, "training loader sharded with DistributedSampler (its shuffle moved into the sampler)")
        if self.options.batch_size == "global" and "batch_size" in keywords:
            self.changed(loader.line, f"batch_size -> batch_size // {WORLD_SIZE} (the global batch stays as in the original)")
        return True

    def _draw_apart(self, loader: LoaderSite, sampler: ast.Call) -> None:
        """A RandomSampler with replacement: each rank draws its own samples from a generator seeded with
        the rank, num_samples (len(dataset) where not given) divided by WORLD_SIZE, as a DistributedSampler
        divides an epoch."""
        self.add_import(TORCH)
        added = {"generator": f"{TORCH}.Generator().manual_seed({rank_seed()})"}
        source = argument(sampler, 0, "data_source")
        if argument(sampler, 2, "num_samples") is None and isinstance(source, (ast.Name, ast.Attribute)):
            added["num_samples"] = f"len({ast.unparse(source)}) // {WORLD_SIZE}"
        self.rewrite_node(sampler, cst.Call, lambda node: _with_own_draws(node, added))
        if self.options.batch_size == "global" and argument(loader.call, _LOADER_POSITIONS.index("batch_size"), "batch_size") is not None:
            self.rewrite_node(loader.call, cst.Call, lambda node: node.with_changes(args=_divided_batch(node.args)))
            self.changed(loader.line, f"batch_size -> batch_size // {WORLD_SIZE} (the global batch stays as in the original)")
        self.changed(sampler.lineno, f"{ast.unparse(sampler.func)}(..., replacement=True) draws from generator={added['generator']}: "
                                     f"each rank draws its own samples, num_samples divided by {WORLD_SIZE}")
        self.advise(loader.line, "each rank draws its own samples with replacement (a generator seeded with the rank): training is "
                                 "statistically, not exactly, equivalent to the original (`ddpify verify` compares the runs in statistical mode)")
        self._drawn_apart = True

    def _missing_sampler(self, line: int, why: str, todo: str) -> None:
        self.missing(line, f"training loader not sharded ({why}): every rank trains on all of its data", todo)

    def _missing_set_epoch(self, line: int, why: str) -> None:
        self.missing(line, f"the training sampler is never told the epoch ({why}): every epoch shuffles the same way",
                     "call <loader>.sampler.set_epoch(epoch) at the start of every epoch by hand")

    def _also_evaluates(self, loader: LoaderSite) -> bool:
        """Does this DataLoader call also build loaders that are only evaluated (loops, comprehensions)?"""
        if any(not loop.trains and loader in loop.loaders for loop in (*self.anatomy.step_loops, *self.anatomy.delegated_steps)):
            return True
        return any(
            loader in self.anatomy.origins(node.iter, ROLE_LOADER)  # type: ignore[attr-defined]
            for node in self.anatomy.nodes_of(ast.comprehension)
        )

    def _sampler_options(self, keywords: dict[str, ast.AST], splats: list[ast.AST]) -> str:
        options = [f"shuffle={self._shuffle_code(keywords, splats)}"]
        seed = _generator_seed(keywords.get("generator"))
        if seed is not None:
            options.append(f"seed={seed}")
        if "drop_last" in keywords:
            options.append(f"drop_last={ast.unparse(keywords['drop_last'])}")
        return ", " + ", ".join(options)

    def _shuffle_code(self, keywords: dict[str, ast.AST], splats: list[ast.AST]) -> str:
        """The loader's shuffle; from a `**kwargs` dict it is popped, since a sampler excludes it."""
        if "shuffle" in keywords:
            return ast.unparse(keywords["shuffle"])
        if len(splats) == 1 and isinstance(splats[0], (ast.Name, ast.Attribute)):
            return f'{ast.unparse(splats[0])}.pop("shuffle", False)'
        if splats:
            self.advise(splats[0].lineno, "loader options come from several ** dicts; remove any shuffle from them (the sampler shuffles)")
        return "False"

    def _with_batch_note(self, stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
        note = _GLOBAL_NOTE if self.options.batch_size == "global" else _PER_GPU_NOTE
        line = cst.EmptyLine(comment=cst.Comment(note))
        return [stmt.with_changes(leading_lines=[*stmt.leading_lines, line])]  # type: ignore[attr-defined]

    # ----- set_epoch ---------------------------------------------------------------------------
    def _set_epoch(self, loop: LoopSite, sharded: list[LoaderSite]) -> list[LoaderSite]:
        """Insert set_epoch for each sharded loader trained on inside `loop`; return those handled.

        A loader whose sampler never shuffles (its DataLoader had no shuffle) needs none: its epoch
        changes nothing. Loaders chosen in branches (`if ...: loader = DataLoader(a) else: ...`) are one
        variable and get one call; when a branch's loader could not be sharded (an IterableDataset,
        a sampler of its own: the conversion is incomplete and says why), the call is guarded by
        `isinstance(..., DistributedSampler)`, so the output written with --partial still runs in
        that branch instead of failing on a sampler without set_epoch."""
        handled = []
        for loader in sharded:
            if not self._trains_inside(loop, loader):
                continue
            handled.append(loader)
            if not any(self.anatomy.loader_shuffles(choice) for choice in self.anatomy.alternatives(loader)):
                continue
            if loop.loop_var is None:
                self._missing_set_epoch(loop.line, "the epoch loop has no epoch variable")
            else:
                unplaced = self._set_epoch_in(loop, loader, self._guarded(loader, sharded))
                if unplaced is not None:
                    self._missing_set_epoch(loop.line, unplaced)
        return handled

    def _set_epoch_in(self, loop: LoopSite, loader: LoaderSite, call: str) -> str | None:
        """Queue `call` (formatted with the loader's name and the epoch) where the epoch loop's
        loader is named: after the statement that rebuilds it in the loop, at the top of the loop, or
        where a pass rebuilds it out of the loop's sight. When there is no such place, why."""
        built_inside = self._binding_inside(loop, loader)
        if built_inside is not None:
            stmt, name = built_inside
            self._queue(self.insert_after, stmt, call.format(name=name, epoch=loop.loop_var), loop.line,
                        f"{name}.sampler.set_epoch({loop.loop_var}) at the start of every epoch")
            return None
        name = self._visible_name(loop, loader)
        if name is not None:
            self._queue(self.insert_at_body_start, loop.node, call.format(name=name, epoch=loop.loop_var), loop.line,  # type: ignore[arg-type]
                        f"{name}.sampler.set_epoch({loop.loop_var}) at the start of every epoch")
            return None
        return self._set_epoch_where_rebuilt(loop, loader, call)

    def _queue(self, insert, anchor: ast.stmt, code: str, line: int, message: str) -> None:
        """Insert `code` at `anchor` once (loaders chosen in branches share their call)."""
        if (anchor, code) not in self._queued:
            self._queued.add((anchor, code))
            insert(anchor, code)
            self.changed(line, message)

    def _guarded(self, loader: LoaderSite, sharded: list[LoaderSite]) -> str:
        """The set_epoch call for `loader`, guarded where a branch may hold a loader left unsharded."""
        call = "{name}.sampler.set_epoch({epoch})\n"
        if self.anatomy.alternatives(loader) <= set(sharded):
            return call
        return ("if isinstance({name}.sampler, DistributedSampler):  # some branch's loader is not sharded\n"
                "    " + call)

    def _set_epoch_where_rebuilt(self, loop: LoopSite, loader: LoaderSite, call: str) -> str | None:
        """A pass that builds its loader anew where the epoch loop can't name it (`for b in
        get_loader(...):`, or a loader built in the function each epoch calls): set_epoch on the new
        loader right after it is built, with the epoch (the loop's variable, or the parameter the
        called function is given it in). When the pass, the loader or the epoch can't be named there, why."""
        a = self.anatomy
        steps = [s for s in (*a.step_loops, *a.delegated_steps)
                 if s.trains and loader in s.loaders and a.body_contains(loop.node.body, lambda n, s=s: n is s.node)]  # type: ignore[attr-defined]
        unnamed = "can't name the training loader in the epoch loop"
        if len(steps) != 1:
            return unnamed
        step = steps[0]
        epoch = loop.loop_var if a.scope_of.get(step.node) == a.scope_of.get(loop.node) else self._epoch_parameter(loop, step.scope)
        if epoch is None:
            return f"the loader is built anew in {step.scope}() each epoch, and {step.scope}() is not given the epoch"
        named = self._named_before(step, loader)
        if named is not None:
            stmt, name = named
            self._queue(self.insert_after, stmt, call.format(name=name, epoch=epoch), stmt.lineno,
                        f"{name}.sampler.set_epoch({epoch}) after the loader is built anew for the epoch")
            return None
        built = self._built_in_pass(step, loader)
        if built is None:
            return unnamed
        if built not in self._named_calls:  # loaders chosen in branches of the function that builds them share it
            self._named_calls.add(built)
            name = self._fresh_name("train_loader")
            self._name_before_pass(a.stmt_of.get(step.node, step.node), built, name, call.format(name=name, epoch=epoch))  # type: ignore[arg-type]
            self.changed(step.line, f"the loader built for each epoch named {name}; {name}.sampler.set_epoch({epoch}) before the pass")
        return None

    def _name_before_pass(self, stmt: ast.stmt, built: ast.Call, name: str, set_epoch: str) -> None:
        """`name = <built>` (with its sampler and every other edit of the call), then `set_epoch`, right
        before `stmt`, which passes over `name` instead: the comments above `stmt` go above the assignment."""
        shard = self._sharded_calls.get(built, lambda node: node)
        edited: list[cst.CSTNode] = []  # the call as edited, kept as the pass leaves it, before its statement
        after_naming = self._statements(set_epoch)

        def name_instead(call: cst.CSTNode) -> cst.CSTNode:
            edited.append(shard(call))
            return cst.Name(name)

        def named_first(stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
            assign = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], edited.pop())],  # type: ignore[arg-type]
                                             leading_lines=stmt.leading_lines)  # type: ignore[attr-defined]
            return [assign, *after_naming, stmt.with_changes(leading_lines=())]

        self.rewrite_node(built, cst.Call, name_instead)
        self.rewrite_statement(stmt, named_first)

    def _built_in_pass(self, step: LoopSite, loader: LoaderSite) -> ast.Call | None:
        """The call that builds the loader right where the pass takes it: `get_loader(...)` in
        `for b in enumerate(get_loader(...))`, or an argument of the call into another file that trains on it."""
        a = self.anatomy
        if isinstance(step.node, ast.Call):
            built = [arg for arg in (*step.node.args, *(kw.value for kw in step.node.keywords)) if isinstance(arg, ast.Call)]
        else:
            built = [_iterated_call(a, step.node.iter)]  # type: ignore[attr-defined, list-item]
        return next((c for c in built if c is not None and (ROLE_LOADER, loader) in a.roles(c)), None)

    def _epoch_parameter(self, loop: LoopSite, scope: str) -> str | None:
        """The parameter of function `scope` that the epoch loop's calls give its epoch variable."""
        a = self.anatomy
        fn = a.functions.get(scope)
        for node in walk_body(loop.node.body) if fn is not None else ():  # type: ignore[attr-defined]
            if isinstance(node, ast.Call) and a.callee(node) == scope:
                for index, param in enumerate(fn.params):  # type: ignore[union-attr]
                    arg = argument(node, index, param)
                    if isinstance(arg, ast.Name) and arg.id == loop.loop_var:
                        return param
        return None

    def _named_before(self, step: LoopSite, loader: LoaderSite) -> tuple[ast.stmt, str] | None:
        """The last assignment before the pass, in its function, that binds the loader to a name."""
        a = self.anatomy
        named = [(node, name) for node in a.nodes
                 if isinstance(node, ast.stmt) and a.scope_of.get(node) == step.scope and node.lineno < step.line
                 and (name := self._loader_bound_by(node, loader)) and a.same_or_outer_block(node, step.node)]
        return max(named, key=lambda found: found[0].lineno, default=None)

    def _loader_bound_by(self, stmt: ast.stmt, loader: LoaderSite) -> str | None:
        """The name `stmt` binds the loader to (`loader = get_loader(...)`, not a progress bar over it)."""
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and self.anatomy.ref(stmt.targets[0]) is not None:
            roles = self.anatomy.roles(stmt.value)
            if (ROLE_LOADER, loader) in roles and (ROLE_PBAR, None) not in roles:
                return ast.unparse(stmt.targets[0])
        return None

    def _passes_numbered(self, loader: LoaderSite) -> bool:
        """Training walks the loader once, or a few times in straight-line code (one function, no
        pass inside a loop: a `next(iter(loader))` peek, then an epoch). Each pass after the first
        moves the sampler to the next epoch, as the single process reshuffles for each pass.
        False when the passes are not like that (nothing is queued then)."""
        a = self.anatomy
        passes = sorted([*(loop.node for loop in a.step_loops if loader in loop.loaders),
                         *(call for call, iterated in a.loader_iters if iterated is loader)], key=lambda node: (node.lineno, node.col_offset))
        if len({a.scope_of.get(node) for node in passes}) != 1 or any(next(a.enclosing(node, _LOOPS), None) for node in passes):
            return False
        names = [self._visible_name(a.site(node), loader) for node in passes[1:]]  # type: ignore[arg-type]
        if None in names:
            return False
        for epoch, (node, name) in enumerate(zip(passes[1:], names), 1):
            stmt = node if isinstance(node, ast.stmt) else a.stmt_of[node]
            self._queue(self.insert_before, stmt, f"{name}.sampler.set_epoch({epoch})  # pass {epoch + 1} over it: reshuffle\n",
                        stmt.lineno, f"{name}.sampler.set_epoch({epoch}) before pass {epoch + 1} over the loader")
        return True

    def _next_epoch_at_restarts(self, sharded: list[LoaderSite]) -> set[LoaderSite]:
        """Loaders training draws from with next(): before each `iter(loader)` inside the training
        loop (a new pass), the sampler moves to its next epoch; the first pass, before the loop, is
        epoch 0. Returns the loaders handled (every pass numbered, or only the first made)."""
        handled, unnamed = set(), set()
        for call, loader, loop in self.anatomy.iterator_passes:
            if loader not in sharded:
                continue
            handled.add(loader)
            if loop is None:
                continue
            source = call.args[0]
            if not isinstance(source, (ast.Name, ast.Attribute)):
                unnamed.add(loader)
                continue
            sampler = f"{ast.unparse(source)}.sampler"
            self._queue(self.insert_before, self.anatomy.stmt_of[call], f"{sampler}.set_epoch({sampler}.epoch + 1)  # a new pass: reshuffle\n",
                        call.lineno, f"{sampler}.set_epoch(...) before each new pass over the loader (the next epoch)")
        return handled - unnamed

    def _trains_inside(self, loop: LoopSite, loader: LoaderSite) -> bool:
        return loop in self.anatomy.epoch_loops_around(loader)

    def _binding_inside(self, loop: LoopSite, loader: LoaderSite) -> tuple[ast.stmt, str] | None:
        """An assignment in the epoch loop's own block that (re)builds the loader each epoch."""
        for stmt in loop.node.body:  # type: ignore[attr-defined]
            name = self._loader_bound_by(stmt, loader)
            if name is not None:
                return stmt, name
        return None

    def _visible_name(self, loop: LoopSite, loader: LoaderSite) -> str | None:
        """The variable holding the loader that the epoch loop's code can see."""
        holders = {r for r in self.anatomy.refs_holding(loader, ROLE_LOADER) if not _is_progress_bar(self.anatomy, r)}
        scope = loop.scope
        cls = self.anatomy.class_of_scope.get(scope)
        visible = [r for r in holders if r.scope == scope or r.scope == "<module>" or (cls and r.scope == cls)]
        mentioned = {self.anatomy.ref(n, scope) for n in ast.walk(loop.node) if isinstance(n, (ast.Name, ast.Attribute))}
        ranked = sorted(visible, key=lambda r: (r not in mentioned, r.scope != scope, r.name))
        return ranked[0].name if ranked else None


_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_LOADER_POSITIONS = ("dataset", "batch_size", "shuffle")  # DataLoader(dataset, batch_size, shuffle, sampler, ...)
_WARM_UP = "with a few epochs of warm-up"


def advise_learning_rate(transform: Transform) -> None:
    """With the batch kept per GPU, the global batch grows WORLD_SIZE times: say how to scale the lr."""
    if transform.options.batch_size != "per-gpu":
        return
    for call in transform.anatomy.calls:
        if transform.anatomy.has_role(call.node, ROLE_OPTIMIZER):
            transform.advise(call.line, f"the global batch is {WORLD_SIZE} times the original (--batch-size per-gpu): to train alike, "
                                        f"{_scaled_learning_rate(call.qualname.rpartition('.')[2])}, "
                                        "or convert with --batch-size global")


def _scaled_learning_rate(name: str) -> str:
    """How to scale the learning rate of optimizer class `name` (or of what a function `name()` returns)."""
    if name in ADAPTIVE_OPTIMIZERS:
        return f"multiply {name}'s learning rate by math.sqrt({WORLD_SIZE}) (square-root rule for adaptive optimizers, {_WARM_UP})"
    if name[:1].isupper():
        return f"multiply {name}'s learning rate by {WORLD_SIZE} (linear scaling rule, {_WARM_UP})"
    return (f"multiply the learning rate of the optimizer {name}() returns by {WORLD_SIZE} (linear scaling rule, SGD) "
            f"or math.sqrt({WORLD_SIZE}) (square-root rule, adaptive optimizers), {_WARM_UP}")


def _bind(node: cst.CSTNode, name: str, parenthesize: bool) -> cst.CSTNode:
    """`name := <dataset expression>` (parenthesized where a keyword value needs it)."""
    parens = {"lpar": [cst.LeftParen()], "rpar": [cst.RightParen()]} if parenthesize else {}
    return cst.NamedExpr(target=cst.Name(name), value=node, **parens)  # type: ignore[arg-type]


def _iterated_call(anatomy, expr: ast.AST) -> ast.Call | None:
    """The call a loop iterates, inside `enumerate(...)`/`tqdm(...)` (`get_loader(...)` in `enumerate(get_loader(...))`)."""
    while isinstance(expr, ast.Call) and anatomy.qualname(expr.func) in ITERATION_WRAPPERS and expr.args:
        expr = expr.args[0]
    return expr if isinstance(expr, ast.Call) else None


def _is_progress_bar(anatomy, ref) -> bool:
    """`pbar = tqdm(loader)` iterates the loader but has no `.sampler`."""
    return any(role == ROLE_PBAR for role, _ in anatomy.values.get(ref, ()))


def _generator_seed(generator: ast.AST | None) -> int | None:
    """The seed of `torch.Generator().manual_seed(S)` when S is a literal."""
    if isinstance(generator, ast.Call) and isinstance(generator.func, ast.Attribute) and generator.func.attr == "manual_seed":
        arg = generator.args[0] if generator.args else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
            return arg.value
    return None


def _argument_index(args: Sequence[cst.Arg], name: str, position: int) -> int | None:
    """Where the call's argument `name` is: `name=...`, or the argument at its position."""
    by_keyword = next((i for i, a in enumerate(args) if a.keyword and a.keyword.value == name), None)
    positional = [i for i, a in enumerate(args) if a.keyword is None and not a.star]
    if by_keyword is None and len(positional) > position:
        return positional[position]
    return by_keyword


def _divided_batch(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    """The loader's arguments with its batch size (`batch_size=...` or at its position) divided by WORLD_SIZE."""
    at = _argument_index(args, "batch_size", _LOADER_POSITIONS.index("batch_size"))
    return [a.with_changes(value=divided_by_world_size(a.value)) if i == at else a for i, a in enumerate(args)]


def _with_own_draws(node: cst.CSTNode, added: dict[str, str]) -> cst.CSTNode:
    """The sampler call with its num_samples divided by WORLD_SIZE and the `added` keywords appended."""
    assert isinstance(node, cst.Call)
    args = [a.with_changes(value=divided_by_world_size(a.value)) if _is_num_samples(a, i) else a for i, a in enumerate(node.args)]
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    args[-1] = args[-1].with_changes(comma=comma)
    new = [cst.Arg(parse_expr(code), keyword=cst.Name(name), equal=_TIGHT_EQUAL, comma=comma) for name, code in added.items()]
    return node.with_changes(args=[*args, *new[:-1], new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])


def _is_num_samples(arg: cst.Arg, index: int) -> bool:
    return arg.keyword.value == "num_samples" if arg.keyword else index == 2


def divided_by_world_size(value: cst.BaseExpression) -> cst.BaseExpression:
    """`value // WORLD_SIZE` (an operation or a conditional in brackets first)."""
    if isinstance(value, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp)):
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(value, cst.FloorDivide(), cst.Name(WORLD_SIZE))
