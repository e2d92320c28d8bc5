"""Transforms 5 and 9: DistributedSampler on training loaders, set_epoch each epoch, batch size.

Each training DataLoader gets `sampler=DistributedSampler(dataset, shuffle=..., seed=..., drop_last=...)`
(its own `shuffle` moves into the sampler), and every epoch loop that trains on it calls
`<loader>.sampler.set_epoch(epoch)` first, so each epoch shuffles differently and all ranks agree.
Evaluation loaders are sharded by the evaluation transform (evaluation.py), or left whole.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import ADAPTIVE_OPTIMIZERS, ROLE_LOADER, ROLE_OPTIMIZER, ROLE_PBAR, LoaderSite, LoopSite
from ddpify.anatomy import distributed as ddp
from ddpify.codemods.base import Duty, Transform, cst_type_of, data_line, parse_expr
from ddpify.codemods.ddp.runtime import WORLD_SIZE

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
        return fresh_name(self.anatomy, base, self._names_taken)

    def _with_sampler(self, node: cst.CSTNode, sampler: str, divide_batch: bool = False) -> cst.CSTNode:
        """The call with `sampler=...` where `shuffle=` was (or appended), keeping its layout."""
        assert isinstance(node, cst.Call)
        new_arg = cst.Arg(keyword=cst.Name("sampler"), value=parse_expr(sampler), equal=_TIGHT_EQUAL)
        args = list(node.args)
        shuffle = next((i for i, a in enumerate(args) if a.keyword and a.keyword.value == "shuffle"), None)
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
        if divide_batch:
            args = [_divided_batch(a) for a in args]
        return node.with_changes(args=args)


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
        sharded = [ld for ld in self.anatomy.train_loaders if self._shard(ld)]
        if sharded:
            self.add_import("torch.utils.data", "DistributedSampler")
            self.fulfil()
            self._advise_learning_rate()
        foreign = [ld for ld in self.anatomy.foreign_loaders if ld.is_train]  # the file that builds it shards it
        if foreign:
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

    def _advise_learning_rate(self) -> None:
        """With the batch kept per GPU, the global batch grows WORLD_SIZE times: say how to scale the lr."""
        if self.options.batch_size != "per-gpu":
            return
        for call in self.anatomy.calls:
            if self.anatomy.has_role(call.node, ROLE_OPTIMIZER):
                name = call.qualname.rpartition(".")[2]
                factor = f"math.sqrt({WORLD_SIZE})" if name in ADAPTIVE_OPTIMIZERS else WORLD_SIZE
                rule = "square-root rule for adaptive optimizers" if name in ADAPTIVE_OPTIMIZERS else "linear scaling rule"
                self.advise(call.line, f"the global batch is {WORLD_SIZE} times the original (--batch-size per-gpu): to train alike, "
                                       f"multiply {name}'s learning rate by {factor} ({rule}, with a few epochs of warm-up), "
                                       "or convert with --batch-size global")

    # ----- the loader call ---------------------------------------------------------------------
    def _shard(self, loader: LoaderSite) -> bool:
        call = loader.call
        if self._also_evaluates(loader):
            self._missing_sampler(loader.line, "this DataLoader call builds training and evaluation loaders alike",
                                  "shard only the training one (DistributedSampler) by hand")
            return False
        keywords = {kw.arg: kw.value for kw in call.keywords if kw.arg}
        if "sampler" in keywords or "batch_sampler" in keywords:
            self._missing_sampler(loader.line, "the training loader has its own sampler", "shard it across ranks by hand")
            return False
        dataset = call.args[0] if call.args else keywords.get("dataset")
        if dataset is None:
            self._missing_sampler(loader.line, "can't tell the training loader's dataset", "add a DistributedSampler by hand")
            return False
        if ddp.is_iterable_dataset(self.anatomy, dataset):
            self._missing_sampler(loader.line, "the training data is an IterableDataset, and a DataLoader takes no sampler for it",
                                  "shard it in its __iter__ by hand (every WORLD_SIZE-th sample, starting at RANK)")
            return False
        splats = [kw.value for kw in call.keywords if kw.arg is None]
        sampler = f"DistributedSampler({self._dataset_code(dataset)}{self._sampler_options(keywords, splats)})"
        self.rewrite_node(call, cst.Call, lambda node: self._with_sampler(node, sampler, self.options.batch_size == "global"))
        self.rewrite_statement(loader.stmt, self._with_batch_note)
        self.changed(loader.line, "training loader sharded with DistributedSampler (its shuffle moved into the sampler)")
        if self.options.batch_size == "global" and "batch_size" in keywords:
            self.changed(loader.line, f"batch_size -> batch_size // {WORLD_SIZE} (the global batch stays as in the original)")
        return True

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
            isinstance(node, ast.comprehension) and loader in self.anatomy.origins(node.iter, ROLE_LOADER)
            for node in self.anatomy.nodes
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
        """Insert set_epoch for each sharded loader trained on inside `loop`; return those handled."""
        handled = []
        for loader in sharded:
            if not self._trains_inside(loop, loader):
                continue
            handled.append(loader)
            if loop.loop_var is None:
                self._missing_set_epoch(loop.line, "the epoch loop has no epoch variable")
                continue
            call = f"{{}}.sampler.set_epoch({loop.loop_var})\n"
            built_inside = self._binding_inside(loop, loader)
            if built_inside is not None:
                stmt, name = built_inside
                self.insert_after(stmt, call.format(name))
            else:
                name = self._visible_name(loop, loader)
                if name is None:
                    self._missing_set_epoch(loop.line, "can't name the training loader in the epoch loop")
                    continue
                self.insert_at_body_start(loop.node, call.format(name))  # type: ignore[arg-type]
            self.changed(loop.line, f"{name}.sampler.set_epoch({loop.loop_var}) at the start of every epoch")
        return handled

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
            self.insert_before(stmt, f"{name}.sampler.set_epoch({epoch})  # pass {epoch + 1} over it: reshuffle\n")
            self.changed(stmt.lineno, f"{name}.sampler.set_epoch({epoch}) before pass {epoch + 1} over the loader")
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
            self.insert_before(self.anatomy.stmt_of[call], f"{sampler}.set_epoch({sampler}.epoch + 1)  # a new pass: reshuffle\n")
            self.changed(call.lineno, f"{sampler}.set_epoch(...) before each new pass over the loader (the next epoch)")
        return handled - unnamed

    def _trains_inside(self, loop: LoopSite, loader: LoaderSite) -> bool:
        return loop in self.anatomy.epoch_loops_around(loader)

    def _binding_inside(self, loop: LoopSite, loader: LoaderSite) -> tuple[ast.stmt, str] | None:
        """An assignment in the epoch loop's own block that (re)builds the loader each epoch."""
        for stmt in loop.node.body:  # type: ignore[attr-defined]
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                roles = self.anatomy.roles(stmt.value)
                if (ROLE_LOADER, loader) in roles and (ROLE_PBAR, None) not in roles and self.anatomy.ref(target) is not None:
                    return stmt, ast.unparse(target)
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


def fresh_name(anatomy, base: str, taken: set[str]) -> str:
    """`base`, or `base1`, `base2`, ...: a name the script doesn't use yet (added to `taken`)."""
    used = {n.id for n in anatomy.nodes if isinstance(n, ast.Name)} | taken
    name = next(f"{base}{i or ''}" for i in range(len(used) + 1) if f"{base}{i or ''}" not in used)
    taken.add(name)
    return name


def _bind(node: cst.CSTNode, name: str, parenthesize: bool) -> cst.CSTNode:
    """`name := <dataset expression>` (parenthesized where a keyword value needs it)."""
    parens = {"lpar": [cst.LeftParen()], "rpar": [cst.RightParen()]} if parenthesize else {}
    return cst.NamedExpr(target=cst.Name(name), value=node, **parens)  # type: ignore[arg-type]


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


def _divided_batch(arg: cst.Arg) -> cst.Arg:
    if arg.keyword is None or arg.keyword.value != "batch_size":
        return arg
    value = arg.value
    if isinstance(value, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp)):
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return arg.with_changes(value=cst.BinaryOperation(value, cst.FloorDivide(), cst.Name(WORLD_SIZE)))

