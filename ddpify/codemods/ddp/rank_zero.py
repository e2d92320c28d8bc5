"""Transform 8: rank-0 duties. Logs, prints, saves and file writes happen once, not once per GPU.

Statement-level rank-0 output, as ddpify.anatomy.output judges it for lint too (`print`, log
records below WARNING, SummaryWriter and wandb calls, `tqdm.write`, `torch.save` and other file
writers: `np.save`, `pickle.dump`, `savefig`, ...), and `with open(..., "w")` blocks go under
`if RANK == 0:` (a line it shares, `if ok: print(x)` or `a; print(a)`, is put one statement a
line first); a `with open(..., "w")` block that also trains stays on every
rank, the others writing to os.devnull; progress bars get `disable=RANK != 0` (or, where every rank
reads what a disabled bar lacks, `bar.desc`, are drawn to os.devnull off rank 0); a SummaryWriter is
built on rank 0 only, the other ranks holding a stand-in whose calls do nothing and whose attributes
the script reads (`writer.log_dir`) are rank 0's; a wandb run is started on every rank, with
mode="disabled" off rank 0 (`wandb.config`, `wandb.log` and the run's calls work there, nothing is
sent); directories are made with
exist_ok=True (every rank makes them at once); `torch.load` maps tensors onto this rank's device;
and where the script later reads what rank 0 saved, a barrier waits for the file, outside any
rank-0 block.

Rank-0-only code never runs work that every rank must join: the DDP wrapper it would call or pass
to a local function becomes `wrapper.module`, also in a local function that only such code calls
(`print('man ->', translate('man'))`, `translate` calling the model it reads as a global, defined at
module level or in the `__main__` block), through any depth of calls. A call in the arguments of an output it guards (a print,
a log, a save) that is not known to only format or read (`vocabulary.is_pure_call`) runs on every rank
first, into a fresh variable the guarded output reads: one that trains or calls a collective, another
file's function that may (`train_one_epoch` imported from engine.py), a forward of a model with
BatchNorm (SyncBatchNorm on GPUs syncs in training mode, `.module` or not), a function every rank
also runs that calls the wrapper itself (`logits(x)` of the training step), and any call whose work is
unknown (`distributed.must_run_on_every_rank`); where it runs maybe or many times, the whole
conditional, comprehension or call taking its lambda is computed. A statement where that can't be
done is left on every rank (with advice) rather than guarded into a deadlock.
"""

from __future__ import annotations

import ast
from typing import Callable, Iterator, Sequence

import libcst as cst

from ddpify.anatomy import MODULE_SCOPE, ROLE_PBAR, ROLE_WRITER, CallSite
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.distributed.every_rank_work import (
    PendingEdits,
    judged_alike_once_made,
    joins_every_rank,
    values_to_compute_first,
    wrappers_run,
)
from ddpify.anatomy.distributed.launch import download_of
from ddpify.anatomy.distributed.ranks import only_called_from, rank_guarded, runs_on_every_rank
from ddpify.anatomy.output import (
    FILE_OUTPUT, FILE_REMOVED, PROGRESS_BAR, WRITER, disabled_off_rank_zero, output_kind, output_statements, rank_zero_object, writes_file_in_block,
)
from ddpify.anatomy.distributed.reaching import calls_running, reaching_values
from ddpify.anatomy.distributed.wrappers import wrapper_or_plain
from ddpify.anatomy.vocabulary import (
    DIRECTORY_CREATORS,
    DISABLED_BAR_ATTRIBUTES,
    TORCH_LOAD,
    TORCH_SAVE,
    TQDM_CONSTRUCTORS,
    WANDB_DISABLED,
    WANDB_MODE,
    WANDB_RUN_STATE,
    WRITER_CONSTRUCTORS,
    opens_for_writing,
)
from ddpify.codemods.base import Transform
from ddpify.codemods.ddp.runtime import ADDED_FUNCTIONS, IS_RANK_ZERO, RANK_DEVICE
from ddpify.edits.expressions import add_keyword, module_of, parse_expr
from ddpify.edits.hoist import hoisted_names, hoisted_then_guarded

# The helpers the other ranks' stand-in for a rank-0-only object needs (added after setup's).
STAND_IN = "RankZeroStandIn"
SHARED_FROM_RANK_ZERO = "shared_from_rank_zero"
STAND_IN_HELPER = f'''

class {STAND_IN}:
    """What the other ranks hold where rank 0 alone builds an object (a
    SummaryWriter, a wandb run): its methods take any arguments and do
    nothing; the attributes given here read as on rank 0."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self  # `run.config.update(...)`: a call that does nothing

    def __call__(self, *args, **kwargs):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False
'''
SHARED_FROM_RANK_ZERO_HELPER = f'''

def {SHARED_FROM_RANK_ZERO}(built, *attributes):
    """Rank 0's `built`; on the other ranks a {STAND_IN} holding rank 0's
    `attributes` (broadcast: paths made from them, such as a writer's log_dir,
    are the same on every rank)."""
    setup_distributed()  # the broadcast needs the group (a no-op once up)
    values = [None]
    if RANK == 0:
        values = [{{name: getattr(built, name, None) for name in attributes}}]
    dist.broadcast_object_list(values, src=0)
    return built if RANK == 0 else {STAND_IN}(**values[0])
'''


class RankZeroDuties(Transform):
    """Print, log, save and write files on rank 0 only; load checkpoints onto this rank's device."""

    NAME = "rank0"
    # The code the duties are written in (the Accelerate target names its own, ddpify.codemods.accelerate)
    ON_RANK_ZERO = IS_RANK_ZERO  # holds on rank 0 only
    OFF_RANK_ZERO = "RANK != 0"  # a progress bar's disable=
    RANK_DEVICE = RANK_DEVICE  # where torch.load maps tensors
    BARRIER = "dist.barrier()"
    # Not the samplers' (names of their own, a `set_epoch` at an epoch loop's top) nor `.module`
    # access's (expression rewrites inside statements it guards; an overlap re-plans, Edits.interferes_with).
    SEES_EDITS_OF = ("setup", "device", "dataparallel", "wrap", "shard", "split", "checkpoint", "state_dict",
                     "parameters", "evaluation", "log-loss")
    PLANS_AHEAD_OF = ("setup", "device", "wrap", "shard", "evaluation", "log-loss")
    SEES_WRAPS_MADE = True  # its wrapper judgements (forwards that join every rank, `.module` in rank-0 code)

    def plan(self) -> None:
        self._barriers: set[ast.stmt] = set()
        self._names_taken: set[str] = set()
        self._stand_in_added = False
        self._judged: list[ast.stmt] = []  # whether they need every rank, or run a wrapper
        self._unwrapped: set[ast.expr] = set()
        saves, removals = [], []
        for call in self.anatomy.calls:
            kind, keeper = output_kind(self.anatomy, call.node), rank_zero_object(self.anatomy, call.node)
            if kind in FILE_OUTPUT and self._per_node(call.node):
                continue
            if kind and self._guard_call(call, kind) and kind in (TORCH_SAVE, FILE_REMOVED):
                (saves if kind == TORCH_SAVE else removals).append(call)
            elif keeper == PROGRESS_BAR:
                self._disable_on_other_ranks(call)
            elif disabled_off_rank_zero(self.anatomy, call.node):
                self._start_disabled_off_rank_zero(call)
            elif keeper == WRITER and isinstance(self.anatomy.parents.get(call.node), ast.Assign):
                self._build_on_rank_zero(call)
            elif call.qualname == TORCH_LOAD:
                self._map_to_rank_device(call)
            elif call.qualname in DIRECTORY_CREATORS:
                self._tolerate_existing_directory(call)
        for stmt in self.anatomy.nodes_of(ast.With, ast.AsyncWith, ast.Assign, ast.Expr):
            if self._per_node(stmt):
                continue
            if self._writes_file_in_block(stmt):
                if self._needs_every_rank(stmt):
                    self._open_on_rank_zero_only(stmt)
                else:
                    self._guard(stmt, "file written")
            elif isinstance(stmt, ast.Assign) and opens_for_writing(self.anatomy, stmt.value):
                self._guard_file_handle(stmt)
            elif isinstance(stmt, ast.Expr) and any(opens_for_writing(self.anatomy, n) for n in ast.walk(stmt)):
                self._guard(stmt, "file written")
        for save in saves:
            self._barrier_before_reads(save)
        for removal in removals:
            self._barrier_after_reads(removal)
        self._unwrap_in_rank_zero_functions()

    def reads_pending_edits(self, pending: PendingEdits) -> bool:
        """Planned ahead of the setup, wrap or shard, devices, evaluation and loss prints: its plan holds
        unless a statement it judged may need every rank, or hold a wrapper, once their edits are made
        (`judged_alike_once_made`). The variables it hoists into are fresh in their output too (fresh_name)."""
        return not all(judged_alike_once_made(self.anatomy, stmt, pending) for stmt in self._judged)

    def _guard_call(self, call: CallSite, kind: str) -> bool:
        stmt = call.stmt
        if not (isinstance(stmt, ast.Expr) and stmt.value is call.node):
            return False
        return self._guard(stmt, kind)

    def _guard(self, stmt: ast.stmt, kind: str) -> bool:
        """Put a statement under `if RANK == 0:` unless a rank test already keeps it off some ranks
        (judged as lint judges it) or it sits inside a block this pass guards."""
        if not runs_on_every_rank(self.anatomy, stmt) or any(self._guarded_here(outer) for outer in self.anatomy.enclosing(stmt, ast.stmt)):
            return True
        if self._needs_every_rank(stmt):
            return self._hoist_then_guard(stmt, kind)
        self._unwrap_for_rank_zero(stmt)
        self.keep_on_rank_zero(stmt, kind)
        return True

    def keep_on_rank_zero(self, stmt: ast.stmt, kind: str) -> None:
        """Put an output statement that every rank runs under `if <ON_RANK_ZERO>:`."""
        self.guard_statement(stmt, self.ON_RANK_ZERO)  # a line it shares (`if ok: print(x)`, `a; print(a)`) is spread first
        self.changed(stmt.lineno, f"{kind} on rank 0 only")

    def _hoist_then_guard(self, stmt: ast.stmt, kind: str) -> bool:
        """`print(f"acc {evaluate(model):.4f}")` where the evaluation may join every rank: it runs on
        every rank into a fresh variable just before (left to right), the print on rank 0 only."""
        hoisted, reason = values_to_compute_first(self.anatomy, stmt)
        if reason is not None:
            self.advise(stmt.lineno, f"{kind} left on every rank: {reason}; compute on every rank and output on rank 0 by hand")
            return False
        names = hoisted_names(self.anatomy, hoisted, lambda base: self.fresh_name(base, self._names_taken))
        values: dict[ast.expr, cst.CSTNode] = {}
        for value in hoisted:
            self.rewrite_expression(value, lambda node, value=value: values.setdefault(value, node))
        self.rewrite_statement(stmt, lambda s: _hoist_found(s, hoisted, names, values, self.ON_RANK_ZERO))
        self._unwrap_for_rank_zero(stmt, keep=hoisted)
        self.changed(stmt.lineno, f"{kind} on rank 0 only, after computing {', '.join(names)} on every rank (work every rank must run)")
        return True

    def _per_node(self, node: ast.AST) -> bool:
        """Is `node` part of a download, whose writes PerNodeDownloads runs once per disk?"""
        return download_of(self.anatomy, node) is not None

    def _guarded_here(self, stmt: ast.stmt) -> bool:
        return self._writes_file_in_block(stmt) and not self._needs_every_rank(stmt)

    def _writes_file_in_block(self, stmt: ast.AST) -> bool:
        return writes_file_in_block(self.anatomy, stmt)

    def _needs_every_rank(self, stmt: ast.stmt) -> bool:
        """Does the statement train or call a collective, or compute in an output's arguments what
        every rank must run?"""
        self._judged.append(stmt)
        return joins_every_rank(self.anatomy, [stmt]) or bool(values_to_compute_first(self.anatomy, stmt)[0])

    def _unwrap_for_rank_zero(self, stmt: ast.stmt, keep: Sequence[ast.expr] = ()) -> None:
        """Rank-0-only code calls the plain model: the DDP wrapper's forward syncs with every rank.
        The values in `keep` run on every rank: they keep the wrapper."""
        for wrapper in wrappers_run(self.anatomy, _walk_outside(stmt, keep)):
            self._use_module(wrapper)

    def _unwrap_in_rank_zero_functions(self) -> None:
        """A local function that rank-0-only code alone calls (`rank_zero_functions`) calls the plain
        model too, or hands it on; not where the wrapper read is a parameter its callers hand
        `wrapper.module` already, nor where it is a plain model on some paths (`model = torch.load(f)`
        after training: `.module` would fail there; lint then names the forward left to do)."""
        a = self.anatomy
        functions = [a.functions[scope].node for scope in rank_zero_functions(a)]
        self._judged.extend(functions)
        for wrapper in wrappers_run(a, (n for fn in functions for n in walk_body(fn.body))):
            if wrapper not in self._unwrapped and not handed_plain(a, wrapper) and not wrapper_or_plain(a, wrapper):
                self._use_module(wrapper)

    def _use_module(self, expr: ast.expr) -> None:
        self._unwrapped.add(expr)
        self.rewrite_expression(expr, module_of)
        name = ast.unparse(expr)
        self.changed(expr.lineno, f"{name} -> {name}.module in rank-0-only code (the DDP wrapper's forward syncs with every rank)")

    def _open_on_rank_zero_only(self, block: ast.With | ast.AsyncWith) -> None:
        """`with open(path, "w") as f:` around training: every rank runs the block, the others write to os.devnull."""
        for item in block.items:
            call = item.context_expr
            if not opens_for_writing(self.anatomy, call):
                continue
            if not call.args:  # type: ignore[attr-defined]
                self.advise(block.lineno, "a file written by every rank around training: write it on rank 0 only by hand")
                continue
            self.rewrite_node(call, cst.Call, lambda node: _path_on_rank_zero(node, self.ON_RANK_ZERO))
            self.add_import("os")
            self.changed(block.lineno, "file written on rank 0 only (the block also trains: other ranks run it writing to os.devnull)")

    def _tolerate_existing_directory(self, call: CallSite) -> None:
        """`os.makedirs(d)` / `os.mkdir(d)`: every rank makes it at once, so none may fail because it exists."""
        node: ast.Call = call.node  # type: ignore[assignment]
        if any(kw.arg == "exist_ok" for kw in node.keywords) or len(node.args) > 2:
            return
        if call.qualname == "os.mkdir" and not isinstance(node.func, ast.Attribute):
            self.advise(call.line, "every rank makes this directory at once: use os.makedirs(..., exist_ok=True) by hand")
            return
        self.rewrite_node(node, cst.Call, _makedirs_exist_ok)
        self.changed(call.line, "os.makedirs(..., exist_ok=True): every rank makes the directory, none fails because another did first")

    def _disable_on_other_ranks(self, call: CallSite) -> None:
        """`tqdm(loader)`: disabled on the other ranks; where every rank reads what a disabled bar
        lacks (`bar.desc`, `bar.start_t`), drawn there to os.devnull instead."""
        lacking = _attributes_a_disabled_bar_lacks(self.anatomy, call)
        if lacking:
            self.rewrite_node(call.node, cst.Call, lambda node: _drawn_to_devnull(node, self.ON_RANK_ZERO))
            self.add_import("os")
            self.changed(call.line, f"progress bar shown on rank 0 only (drawn to os.devnull elsewhere: the script reads "
                                    f"its {', '.join(lacking)}, which a disabled bar lacks)")
            return
        self.rewrite_node(call.node, cst.Call, lambda node: _with_disable(node, self.OFF_RANK_ZERO))
        self.changed(call.line, f"progress bar shown on rank 0 only (disable={self.OFF_RANK_ZERO})")

    def _start_disabled_off_rank_zero(self, call: CallSite) -> None:
        """`wandb.init(...)`: every rank starts the run, the others with mode="disabled" (wandb's run
        that sends nothing), so `wandb.config.lr`, `wandb.log(...)`, `run.config` and `run.finish()`
        work on every rank and rank 0 alone sends; a `mode=` the script gives is rank 0's. Attributes
        of its own that a disabled run holds (`run.dir`, `run.name`) are not rank 0's: where every rank
        reads one, advised."""
        node: ast.Call = call.node  # type: ignore[assignment]
        if not runs_on_every_rank(self.anatomy, call.stmt):
            return
        if any(kw.arg is None for kw in node.keywords):
            self.advise(call.line, f"wandb.init(**...) starts a run on every rank: pass it mode={WANDB_DISABLED} off rank 0 by hand")
            return
        self.rewrite_node(node, cst.Call, lambda c: _disabled_mode_off_rank_zero(c, self.ON_RANK_ZERO))
        self.changed(call.line, f"wandb run started on every rank, mode={WANDB_DISABLED} off rank 0 (its calls work there, "
                                "rank 0 alone sends)")
        own = sorted(_read_on_every_rank(self.anatomy, call, ROLE_WRITER, WRITER_CONSTRUCTORS) - WANDB_RUN_STATE)
        if own:
            self.advise(call.line, f"the other ranks' disabled wandb run has its own {', '.join(own)}, not rank 0's: "
                                   "where every rank needs rank 0's, broadcast it by hand")

    def _build_on_rank_zero(self, call: CallSite) -> None:
        """`writer = SummaryWriter(...)` / `run = wandb.init(...)`: built on rank 0 only. The other
        ranks hold a RankZeroStandIn, whose calls do nothing wherever the object goes (an argument,
        `self.writer`); the attributes the script reads (`writer.log_dir`) are rank 0's, broadcast
        when it is built, so paths made from them are the same on every rank. Where no helper can
        be added (an imported module), the other ranks hold None, as its guarded calls allow."""
        name = call.qualname.rsplit(".", 1)[-1]
        shared = _attributes_read(self.anatomy, call)
        if not self._add_stand_in(shared):
            self.rewrite_node(call.node, cst.Call, lambda node: _only_on_rank_zero(node, self.ON_RANK_ZERO))
            self.changed(call.line, f"{name} created on rank 0 only (None elsewhere; its calls are guarded)")
            if shared:
                self.advise(call.line, f"other ranks hold None for this {name} but read {', '.join(shared)} of it: "
                                       "compute those on every rank by hand")
            return
        self.rewrite_node(call.node, cst.Call, lambda node: _with_stand_in(node, shared, self.ON_RANK_ZERO))
        reads = f"; its {', '.join(shared)} broadcast from rank 0" if shared else ""
        self.changed(call.line, f"{name} created on rank 0 only (a stand-in elsewhere, whose calls do nothing{reads})")

    def _add_stand_in(self, shared: Sequence[str]) -> bool:
        """Add the stand-in helpers after the distributed setup's, made or pending (False: there is
        none, as in an imported module)."""
        wanted = {STAND_IN: STAND_IN_HELPER, SHARED_FROM_RANK_ZERO: SHARED_FROM_RANK_ZERO_HELPER if shared else ""}
        defined = {n.name: n for n in self.anatomy.tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        missing = {name: code for name, code in wanted.items() if code and name not in defined}
        setup = [defined[name] for name in ADDED_FUNCTIONS if name in defined]
        if setup:
            if missing and not self._stand_in_added:
                self.insert_after(max(setup, key=lambda fn: fn.lineno), "".join(missing.values()))
        elif self.can_add_helpers():
            for name, code in missing.items():
                self.add_helper(name, code)
        else:
            return False
        self._stand_in_added = True
        return True

    def _map_to_rank_device(self, call: CallSite) -> None:
        node: ast.Call = call.node  # type: ignore[assignment]
        if len(node.args) >= 2 or any(kw.arg == "map_location" for kw in node.keywords):
            return
        self.rewrite_node(node, cst.Call, lambda c: add_keyword(c, "map_location", self.RANK_DEVICE))
        self.changed(call.line, f"torch.load(..., map_location={self.RANK_DEVICE}): tensors land on this rank's device")

    def _guard_file_handle(self, assign: ast.Assign) -> None:
        """`f = open(path, "a")`: open, write and close on rank 0 only. A handle kept on an object
        (`self.file = open(...)`) is used where it can't be followed: every rank opens one, and the
        other ranks' write to os.devnull."""
        handle = self.anatomy.ref(assign.targets[0])
        if handle is not None and handle.name.startswith("self.") and assign.value.args:  # type: ignore[attr-defined]
            self.rewrite_node(assign.value, cst.Call, lambda node: _path_on_rank_zero(node, self.ON_RANK_ZERO))
            self.add_import("os")
            self.changed(assign.lineno, "file opened on every rank, written on rank 0 only (os.devnull elsewhere)")
            return
        if handle is None:
            self.missing(assign.lineno, "a file is opened for writing on every rank", "write it on rank 0 only by hand")
            return
        self._guard(assign, "file opened")
        for call in self.anatomy.calls:
            func = call.node.func  # type: ignore[attr-defined]
            if isinstance(func, ast.Attribute) and self.anatomy.ref(func.value) == handle:
                self._guard_call(call, "file written")

    def _barrier_before_reads(self, save: CallSite) -> None:
        """Other ranks wait for rank 0's file where a checkpoint is read later: after the save when
        its own function reads one later, and after each call that runs the save (through any
        depth of calls) when the calling function reads one later (`pretrain(path)`, then
        `torch.load(path)`)."""
        a = self.anatomy
        if self._loads_after(save.scope, save.line):
            guarded = [outer for outer in a.enclosing(save.stmt, ast.stmt) if self._guarded_here(outer)]
            self._barrier_after(guarded[-1] if guarded else save.stmt, save.line, "the save")  # never inside a rank-0 block
        for call in calls_running(a, save.scope):
            if self._loads_after(a.scope_of.get(call, MODULE_SCOPE), call.lineno):
                self._barrier_after(a.stmt_of[call], call.lineno, "the call that saves it")

    def _barrier_after_reads(self, removal: CallSite) -> None:
        """Rank 0 removes a file only once the other ranks have read what its function loaded before
        (`state = torch.load(path)`, then `os.remove(path)`): a barrier before the removal, or advice
        where it sits in a loop (its ranks may not loop alike: a barrier there could hang) or off some ranks."""
        a = self.anatomy
        if not self._loads_in(removal.scope, lambda line: line < removal.line):
            return
        guarded = [outer for outer in a.enclosing(removal.stmt, ast.stmt) if self._guarded_here(outer)]
        anchor = guarded[-1] if guarded else removal.stmt
        in_loop = any(isinstance(outer, (ast.For, ast.While)) for outer in a.enclosing(anchor, ast.stmt))
        if in_loop or _shares_its_line(a, anchor) or not runs_on_every_rank(a, anchor):
            self.advise(removal.line, f"other ranks may still read this file: add {self.BARRIER} before its removal by hand")
            return
        self.insert_before(anchor, f"{self.BARRIER}  # every rank has read the file rank 0 removes next\n")
        self.changed(removal.line, "barrier before the removal: other ranks read that file first")

    def _loads_after(self, scope: str, line: int) -> bool:
        """Does function `scope` read a checkpoint after `line` (itself, or in a function it calls there)?"""
        return self._loads_in(scope, lambda at: at > line)

    def _loads_in(self, scope: str, where: Callable[[int], bool]) -> bool:
        """Does function `scope` read a checkpoint on a line `where` holds (itself, or in a function it calls there)?"""
        a = self.anatomy
        fn = a.functions.get(scope)
        calls = [n for n in walk_body(fn.node.body if fn else a.tree.body) if isinstance(n, ast.Call) and where(n.lineno)]
        return any(_loads(a, n) or ((callee := a.callee(n)) is not None and a.function_contains(callee, lambda m: _loads(a, m)))
                   for n in calls)

    def _barrier_after(self, anchor: ast.stmt, line: int, what: str) -> None:
        if anchor in self._barriers:
            return
        self._barriers.add(anchor)
        if _shares_its_line(self.anatomy, anchor) or not runs_on_every_rank(self.anatomy, anchor):
            self.advise(line, f"other ranks read this checkpoint later: add {self.BARRIER} after {what} by hand")
            return
        self.insert_after(anchor, f"{self.BARRIER}  # the file rank 0 saved is read below\n")
        self.changed(line, f"barrier after {what}: other ranks read that checkpoint later")


def _hoist_found(stmt: cst.BaseStatement, hoisted: list[ast.expr], names: list[str], values: dict[ast.expr, cst.CSTNode],
                 condition: str) -> list[cst.BaseStatement]:
    """`hoisted_then_guarded` with the CST values found; the statement as it was where one wasn't
    (its ast position off, as inside some f-strings): lint then reports the print as left undone."""
    if any(value not in values for value in hoisted):
        return [stmt]
    return hoisted_then_guarded(stmt, [(values[value], name) for value, name in zip(hoisted, names)], condition)


@per_anatomy
def handed_plain_on_rank_zero(a) -> set[ast.expr]:
    """The wrappers that rank-0-only code hands to a local function (`print(describe(model))`, or
    `describe(model)` in a function that only such code calls): it is handed `wrapper.module` instead,
    so that function's parameter may hold the plain model. Judged before planning: an argument
    computed first on every rank, which keeps the wrapper, counts too."""
    outputs = [n for stmt in output_statements(a) for n in ast.walk(stmt)]
    bodies = [n for scope in rank_zero_functions(a) for n in walk_body(a.functions[scope].node.body)]
    return set(wrappers_run(a, outputs + bodies))


def handed_plain(a, read: ast.expr) -> bool:
    """Does rank-0-only code hand the function that `read` is in the plain model (`print(describe(model))`
    calls `describe(model.module)`), through any depth of calls?"""
    handed, seen, values = handed_plain_on_rank_zero(a), set(), reaching_values(a, read)
    while values:
        value = values.pop()
        if value in handed:
            return True
        if isinstance(value, (ast.Name, ast.Attribute)) and value not in seen:
            seen.add(value)
            values.extend(reaching_values(a, value))
    return False


@per_anatomy
def rank_zero_functions(a) -> set[str]:
    """The local functions that rank 0 alone runs once output is guarded (`translate` of
    `print('man ->', translate('man'))`): each call of them sits in rank-0-only output, under a rank
    test, or in another such function (which may be itself)."""
    return only_called_from(a, {n for stmt in output_statements(a) for n in _rank_zero_part(a, stmt) if isinstance(n, ast.Call)})


def _rank_zero_part(a, stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of output statement `stmt` that rank 0 alone runs once it is planned: all but the
    values computed first on every rank; none where it stays on every rank (a block that trains, a
    print whose work can't be computed apart from it, a spawn script's parent)."""
    if not (runs_on_every_rank(a, stmt) or rank_guarded(a, stmt)):
        return []
    if isinstance(stmt, ast.Expr):
        hoisted, reason = values_to_compute_first(a, stmt)
        return [] if reason else list(_walk_outside(stmt, hoisted))
    return [] if joins_every_rank(a, [stmt]) else list(ast.walk(stmt))


def _walk_outside(root: ast.AST, skipped: Sequence[ast.AST]) -> Iterator[ast.AST]:
    """`ast.walk(root)`, not entering the `skipped` nodes."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node in skipped:
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _loads(anatomy, node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and anatomy.qualname(node.func) == TORCH_LOAD


def _shares_its_line(anatomy, stmt: ast.stmt) -> bool:
    """`x = 1; print(x)`, `if ok: print(x)`: the statement is not alone on its line(s)."""
    before = anatomy.lines[stmt.lineno - 1].encode()[:stmt.col_offset]
    if before.strip():
        return True
    return any(other is not stmt and other.lineno <= stmt.end_lineno and other.end_lineno >= stmt.lineno  # type: ignore[operator]
               for other in anatomy.block_of(stmt))


def _only_on_rank_zero(node: cst.CSTNode, condition: str, elsewhere: str = "None") -> cst.CSTNode:
    return cst.IfExp(test=parse_expr(condition), body=node, orelse=parse_expr(elsewhere))  # type: ignore[arg-type]


def _with_stand_in(node: cst.CSTNode, shared: Sequence[str], condition: str) -> cst.CSTNode:
    """`SummaryWriter()` -> `SummaryWriter() if RANK == 0 else RankZeroStandIn()`, or with attributes
    read: `shared_from_rank_zero(SummaryWriter() if RANK == 0 else None, "log_dir")`."""
    if not shared:
        return _only_on_rank_zero(node, condition, f"{STAND_IN}()")
    names = [cst.Arg(cst.SimpleString(f'"{name}"')) for name in shared]
    return cst.Call(cst.Name(SHARED_FROM_RANK_ZERO), [cst.Arg(_only_on_rank_zero(node, condition)), *names])  # type: ignore[arg-type]


def _attributes_read(anatomy, built: CallSite) -> list[str]:
    """The attributes the script reads of what `built` makes (`writer.log_dir`, `self.run.dir`, a
    parameter's `writer.log_dir`): values, not methods called. A read whose object can't be
    followed back to any writer the script builds counts for each."""
    return sorted({node.attr for node in _reads_of(anatomy, built, ROLE_WRITER, WRITER_CONSTRUCTORS)
                   if not isinstance(anatomy.parents.get(node), ast.Attribute)})


def _attributes_a_disabled_bar_lacks(anatomy, built: CallSite) -> list[str]:
    """The attributes that every rank reads of the progress bar `built` makes and that a disabled
    bar lacks (`bar.desc`, `bar.start_t`; `bar.n` it keeps)."""
    return sorted(_read_on_every_rank(anatomy, built, ROLE_PBAR, TQDM_CONSTRUCTORS) - DISABLED_BAR_ATTRIBUTES)


def _read_on_every_rank(anatomy, built: CallSite, role: str, constructors: frozenset[str]) -> set[str]:
    """The attributes of what `built` makes that every rank reads (not in output, which rank 0 alone makes)."""
    in_output = {n for stmt in output_statements(anatomy) for n in ast.walk(stmt)}
    return {node.attr for node in _reads_of(anatomy, built, role, constructors)
            if node not in in_output and runs_on_every_rank(anatomy, node)}


def _reads_of(anatomy, built: CallSite, role: str, constructors: frozenset[str]) -> Iterator[ast.Attribute]:
    """The reads of a public attribute (not a method called) of an object of `role` that `built`
    may have made, or that can't be followed back to any call of `constructors`."""
    for node in anatomy.nodes:
        parent = anatomy.parents.get(node)
        if not isinstance(node, ast.Attribute) or node.attr.startswith("_") or not isinstance(node.ctx, ast.Load):
            continue
        if not anatomy.has_role(node.value, role) or (isinstance(parent, ast.Call) and parent.func is node):
            continue
        origins = _built_by(anatomy, node.value, constructors)
        if built.node in origins or not origins:
            yield node


def _built_by(anatomy, expr: ast.AST, constructors: frozenset[str], depth: int = 0) -> set[ast.AST]:
    """The calls of `constructors` whose object `expr` may hold (through variables, parameters, `self`)."""
    if isinstance(expr, ast.Call):
        return {expr} if anatomy.qualname(expr.func) in constructors else set()
    if depth > 6 or not isinstance(expr, (ast.Name, ast.Attribute)):
        return set()
    return {c for value in reaching_values(anatomy, expr) for c in _built_by(anatomy, value, constructors, depth + 1)}


def _path_on_rank_zero(node: cst.CSTNode, condition: str) -> cst.CSTNode:
    """`open(path, ...)` -> `open(path if RANK == 0 else os.devnull, ...)`."""
    assert isinstance(node, cst.Call)
    first = node.args[0]
    path = cst.IfExp(test=parse_expr(condition), body=first.value, orelse=parse_expr("os.devnull"))
    return node.with_changes(args=[first.with_changes(value=path), *node.args[1:]])


def _makedirs_exist_ok(node: cst.CSTNode) -> cst.CSTNode:
    """`os.mkdir(d)` / `os.makedirs(d)` -> `os.makedirs(d, exist_ok=True)`; `makedirs(d)` imported from os keeps its name."""
    assert isinstance(node, cst.Call)
    if isinstance(node.func, cst.Attribute):
        node = node.with_changes(func=node.func.with_changes(attr=cst.Name("makedirs")))
    return add_keyword(node, "exist_ok", "True")


def _drawn_to_devnull(node: cst.CSTNode, condition: str) -> cst.CSTNode:
    """`tqdm(xs)` -> `tqdm(xs, file=None if RANK == 0 else open(os.devnull, "w"))` (None: its default,
    stderr); a `file=f` given becomes `f if RANK == 0 else ...`."""
    devnull = 'open(os.devnull, "w")'
    return _set_keyword(node, "file", lambda given: f"({given}) if {condition} else {devnull}", f"None if {condition} else {devnull}")


def _disabled_mode_off_rank_zero(node: cst.CSTNode, condition: str) -> cst.CSTNode:
    """`wandb.init(...)` -> `wandb.init(..., mode=None if RANK == 0 else "disabled")` (None: its
    default); a `mode=m` given becomes `(m) if RANK == 0 else "disabled"`."""
    return _set_keyword(node, WANDB_MODE, lambda given: f"({given}) if {condition} else {WANDB_DISABLED}",
                        f"None if {condition} else {WANDB_DISABLED}")


def _with_disable(node: cst.CSTNode, off_rank_zero: str) -> cst.CSTNode:
    return _set_keyword(node, "disable", lambda given: f"({given}) or {off_rank_zero}", off_rank_zero)


def _set_keyword(node: cst.CSTNode, name: str, combined: Callable[[str], str], absent: str) -> cst.CSTNode:
    """The call with `name=combined(<the value given>)`, or `name=absent` added where none is given."""
    assert isinstance(node, cst.Call)
    for i, arg in enumerate(node.args):
        if arg.keyword and arg.keyword.value == name:
            chosen = parse_expr(combined(cst.Module([]).code_for_node(arg.value)))
            return node.with_changes(args=[*node.args[:i], arg.with_changes(value=chosen), *node.args[i + 1:]])
    return add_keyword(node, name, absent)
