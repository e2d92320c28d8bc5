"""Transform 8: rank-0 duties. Logs, prints, saves and file writes happen once, not once per GPU.

Statement-level `print`, `logging`/logger calls, SummaryWriter and wandb calls, `tqdm.write`,
`torch.save` and `with open(..., "w")` blocks go under `if RANK == 0:`; progress bars get
`disable=RANK != 0`; a SummaryWriter is built on rank 0 only; `torch.load` maps tensors onto this
rank's device; and where the script later reads what rank 0 saved, a barrier waits for the file.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import LOG_METHODS, ROLE_LOGGER, ROLE_PBAR, ROLE_WRITER, CallSite
from ddpify.codemods.base import Transform, parse_expr
from ddpify.codemods.ddp.runtime import IS_RANK_ZERO, RANK_DEVICE

_TQDM = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm"})
_WRITERS = frozenset({"torch.utils.tensorboard.SummaryWriter", "tensorboardX.SummaryWriter", "wandb.init"})
_WRITE_MODES = frozenset("wax+")


class RankZeroDuties(Transform):
    NAME = "rank0"
    DESCRIPTION = "Print, log, save and write files on rank 0 only; load checkpoints onto this rank's device."

    def plan(self) -> None:
        saves = []
        for call in self.anatomy.calls:
            kind = self._rank_zero_kind(call)
            if kind and self._guard_call(call, kind) and kind == "torch.save":
                saves.append(call)
            elif call.qualname in _TQDM:
                self._disable_on_other_ranks(call)
            elif call.qualname in _WRITERS and isinstance(self.anatomy.parents.get(call.node), ast.Assign):
                self._build_on_rank_zero(call)
            elif call.qualname == "torch.load":
                self._map_to_rank_device(call)
        for stmt in ast.walk(self.anatomy.tree):
            if isinstance(stmt, (ast.With, ast.AsyncWith)) and any(_opens_for_writing(self.anatomy, i.context_expr) for i in stmt.items):
                self._guard(stmt, "file written")
            elif isinstance(stmt, ast.Assign) and _opens_for_writing(self.anatomy, stmt.value):
                self._guard_file_handle(stmt)
            elif isinstance(stmt, ast.Expr) and any(_opens_for_writing(self.anatomy, n) for n in ast.walk(stmt)):
                self._guard(stmt, "file written")
        for save in saves:
            self._barrier_before_reads(save)

    def _rank_zero_kind(self, call: CallSite) -> str | None:
        """Why this call is a rank-0 duty: 'print', 'logging', 'tensorboard', 'wandb', 'torch.save'."""
        q = call.qualname
        func = call.node.func  # type: ignore[attr-defined]
        method = func.attr if isinstance(func, ast.Attribute) else None
        if q in ("print", "torch.save") or q.endswith("tqdm.write"):
            return q
        if q.startswith("logging.") and method in LOG_METHODS:
            return "logging"
        if q.startswith("wandb.") and method not in ("Table", "Image", "Histogram"):
            return "wandb"
        if method is None:
            return None
        if method in LOG_METHODS and self.anatomy.has_role(func.value, ROLE_LOGGER):
            return "logging"
        if self.anatomy.has_role(func.value, ROLE_WRITER):
            return "tensorboard/wandb"
        if method == "write" and self.anatomy.has_role(func.value, ROLE_PBAR):
            return "print"
        return None

    def _guard_call(self, call: CallSite, kind: str) -> bool:
        stmt = call.stmt
        if not (isinstance(stmt, ast.Expr) and stmt.value is call.node):
            return False
        return self._guard(stmt, kind)

    def _guard(self, stmt: ast.stmt, kind: str) -> bool:
        """Put a statement under `if RANK == 0:` unless it already sits inside one this pass adds."""
        if any(self._guarded_here(outer) for outer in self.anatomy.enclosing(stmt, ast.stmt)):
            return True
        self.guard_statement(stmt, IS_RANK_ZERO)
        self.changed(stmt.lineno, f"{kind} on rank 0 only")
        return True

    def _guarded_here(self, stmt: ast.stmt) -> bool:
        return isinstance(stmt, (ast.With, ast.AsyncWith)) and any(_opens_for_writing(self.anatomy, i.context_expr) for i in stmt.items)

    def _disable_on_other_ranks(self, call: CallSite) -> None:
        self.rewrite_node(call.node, cst.Call, _with_disable)
        self.changed(call.line, "progress bar shown on rank 0 only (disable=RANK != 0)")

    def _build_on_rank_zero(self, call: CallSite) -> None:
        """`writer = SummaryWriter(...)` / `run = wandb.init(...)`: None on other ranks (its calls are guarded)."""
        self.rewrite_node(call.node, cst.Call, lambda node: cst.IfExp(
            test=parse_expr(IS_RANK_ZERO), body=node, orelse=cst.Name("None")))  # type: ignore[arg-type]
        name = call.qualname.rsplit(".", 1)[-1]
        self.changed(call.line, f"{name} created on rank 0 only (None elsewhere; its calls are guarded)")

    def _map_to_rank_device(self, call: CallSite) -> None:
        node: ast.Call = call.node  # type: ignore[assignment]
        if len(node.args) >= 2 or any(kw.arg == "map_location" for kw in node.keywords):
            return
        self.rewrite_node(node, cst.Call, lambda c: _add_keyword(c, "map_location", RANK_DEVICE))
        self.changed(call.line, f"torch.load(..., map_location={RANK_DEVICE}): tensors land on this rank's device")

    def _guard_file_handle(self, assign: ast.Assign) -> None:
        """`f = open(path, "a")`: open, write and close on rank 0 only."""
        handle = self.anatomy.ref(assign.targets[0])
        if handle is None:
            self.advise(assign.lineno, "file opened for writing on every rank; write it on rank 0 only by hand")
            return
        self._guard(assign, "file opened")
        for call in self.anatomy.calls:
            func = call.node.func  # type: ignore[attr-defined]
            if isinstance(func, ast.Attribute) and self.anatomy.ref(func.value) == handle:
                self._guard_call(call, "file written")

    def _barrier_before_reads(self, save: CallSite) -> None:
        """Other ranks wait for rank 0's file when the same function reads a checkpoint later."""
        later_loads = [c for c in self.anatomy.calls_to("torch.load") if c.scope == save.scope and c.line > save.line]
        if later_loads:
            self.insert_after(save.stmt, "dist.barrier()  # the file rank 0 saved is read below\n")
            self.changed(save.line, "barrier after the save: other ranks read that checkpoint later")


def _opens_for_writing(anatomy, call: ast.AST) -> bool:
    """`open(path, "w")` (or "a", "x", "+")."""
    if not (isinstance(call, ast.Call) and anatomy.qualname(call.func) in ("open", "io.open")):
        return False
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(_WRITE_MODES & set(mode.value))


def _with_disable(node: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(node, cst.Call)
    for i, arg in enumerate(node.args):
        if arg.keyword and arg.keyword.value == "disable":
            combined = parse_expr(f"({cst.Module([]).code_for_node(arg.value)}) or RANK != 0")
            return node.with_changes(args=[*node.args[:i], arg.with_changes(value=combined), *node.args[i + 1:]])
    return _add_keyword(node, "disable", "RANK != 0")


def _add_keyword(node: cst.CSTNode, keyword: str, value: str) -> cst.CSTNode:
    assert isinstance(node, cst.Call)
    new = cst.Arg(keyword=cst.Name(keyword), value=parse_expr(value),
                  equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
    if not node.args:
        return node.with_changes(args=[new])
    args = list(node.args)
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # trailing comma: keep the call's own layout
        separator = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else last.comma
        args[-1] = last.with_changes(comma=separator)
        return node.with_changes(args=[*args, new.with_changes(comma=last.comma)])
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return node.with_changes(args=[*args, new])
