"""The base of every codemod: a Transform reads the anatomy and queues edits at its positions.

The anatomy (built on `ast`) says *where* things are; the transform queues its `Edits` by (line,
column) (`ddpify.edits.engine`), and one LibCST pass makes them. It reports what it changed
(`ddpify.codemods.report`) and whether it did its duty (`ddpify.codemods.duties`).

A Transform has the shape of a thin LibCST `Codemod` (built with a context, `transform_module`), so
LibCST's `CodemodTest.assertCodemod` tests it; it does not subclass one: importing `libcst.codemod`
(its matchers) would add 0.14 s to the start of every `ddpify lint`, whose rules share these edits.
"""

from __future__ import annotations

import ast
import functools
from typing import TYPE_CHECKING, Callable, ClassVar, Collection, Sequence

import libcst as cst

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.every_rank_work import PendingEdits
from ddpify.codemods.duties import Duty
from ddpify.codemods.options import Options
from ddpify.codemods.report import Advice, Change, Import, Missing, Report
from ddpify.edits.engine import Edits, GroupBuilder
from ddpify.edits.expressions import cst_type_of
from ddpify.edits.hoist import fresh_name
from ddpify.edits.positions import key_of
from ddpify.edits.statements import StatementRewrite, guard, parse_statements

if TYPE_CHECKING:
    from libcst.codemod import CodemodContext


class Transform:
    """Base of every rewrite step. Subclasses say what they do in their docstring, set NAME and override `plan()`."""

    NAME: ClassVar[str] = ""
    DUTY: ClassVar[Duty | None] = None
    # NAMEs of the earlier transforms whose edits this one's plan reads (it is planned on the code
    # they produced); None: every earlier transform's. The others' edits may still be pending.
    SEES_EDITS_OF: ClassVar[tuple[str, ...] | None] = None
    # NAMEs of those whose pending edits its plan can read as facts (Edits.as_pending) instead of
    # waiting for them: it is planned on the code before them, its edits made after theirs in the same
    # pass (Edits.merge_after), unless reads_pending_edits says its plan may differ once they are made.
    PLANS_AHEAD_OF: ClassVar[tuple[str, ...]] = ()
    # Does its plan read the wrapper only as the analysis sees it? Then, planned ahead of a pending DDP
    # wrap, it plans on the anatomy that shows the wrap made (ddpify.anatomy.distributed.wraps_made).
    SEES_WRAPS_MADE: ClassVar[bool] = False

    def __init__(self, context: CodemodContext | None, anatomy: Anatomy, options: Options, pending: Edits | None = None) -> None:
        self.context = context  # what CodemodTest passes; a conversion reads nothing from it
        self.anatomy = anatomy
        self.options = options
        self.pending = pending or Edits()  # the edits of earlier transforms, planned on the same code, not made yet
        self.report = Report()
        self.edits = Edits()

    # ----- what subclasses implement -----------------------------------------------------------
    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        """False when the options ask nothing of this transform, or the code holds nothing it works on
        (judged on code that the earlier transforms' pending edits never add to): then it is not
        planned, and no stage waits for those edits."""
        return True

    def plan(self) -> None:
        """Queue this transform's edits from the anatomy (called before the tree is visited)."""

    def reads_pending_edits(self, pending: PendingEdits) -> bool:
        """Planned ahead of the `pending` edits of PLANS_AHEAD_OF: might its plan differ on the code they
        produce? Then it is planned again on that code."""
        return True

    def fresh_name(self, base: str, taken: set[str]) -> str:
        """`base`, or `base1`, ...: a name neither the script, `taken`, nor the pending edits use (what
        they add counts as taken: the name must be fresh in their output too), recorded as one these
        edits add."""
        if self.pending:
            taken |= self._pending_names
        name = fresh_name(self.anatomy, base, taken)
        self.edits.fresh.add(name)
        return name

    @functools.cached_property
    def _pending_names(self) -> set[str]:
        return self.pending.names_added()

    # ----- reporting -------------------------------------------------------------------------
    def changed(self, line: int, message: str) -> None:
        self.report.changes.append(Change(line, self.NAME, message))

    def advise(self, line: int, message: str) -> None:
        self.report.advice.append(Advice(line, message))

    def missing(self, line: int, what: str, todo: str) -> None:
        """Something the conversion needs and this transform could not do: the result is incomplete."""
        self.report.missing.append(Missing(line, what, todo))

    def fulfil(self) -> None:
        """This transform did its DUTY (at least once)."""
        self.report.fulfilled = True

    def models_to_wrap(self, wrapper: str, averaged: Collection[ast.AST] = ()) -> list:
        """The trained models this file wraps in `wrapper`. Each optimizer whose model the analysis cannot
        bind trains a model left unwrapped: a missing item, unless another file of the project binds that
        model to an optimizer and wraps it there (then, with no model here, the duty is done there), or it
        is one of the optimizers `averaged` by hand."""
        models = self.anatomy.trained_models
        if self.anatomy.facts.models_trained_elsewhere:
            if not models:
                self.fulfil()
            return models
        unbound = self.anatomy.trained_models_unbound
        named = {used_at for _, used_at in unbound}  # optimizers whose missing models are named below
        for optimizer in self.anatomy.optimizers_without_model:
            if optimizer.node not in named and optimizer.node not in averaged:
                self.missing(optimizer.line, f"the model this optimizer trains was not found, so it is not wrapped in {wrapper}",
                             f"wrap that model in {wrapper} once it is on its device, and build the optimizer on its parameters")
        for read, _ in unbound:
            name = ast.unparse(read)
            self.missing(read.lineno, f"an optimizer trains {name}, but where {name} gets its model was not found, so it is not wrapped in {wrapper}",
                         f"wrap {name} in {wrapper} by hand once it is on its device, before the optimizer is built on its parameters")
        return models

    # ----- queuing edits ---------------------------------------------------------------------
    def insert_before(self, stmt: ast.stmt, code: str | Sequence[cst.BaseStatement]) -> None:
        self.edits.before.setdefault(self.edits.at(stmt), []).extend(self._statements(code))

    def insert_after(self, stmt: ast.stmt, code: str | Sequence[cst.BaseStatement]) -> None:
        self.edits.after.setdefault(self.edits.at(stmt), []).extend(self._statements(code))

    def insert_at_body_start(self, compound: ast.stmt, code: str | Sequence[cst.BaseStatement]) -> None:
        """Insert as the first statements of a def/for/while/with/if body (after a docstring)."""
        self.edits.body_start.setdefault(self.edits.at(compound), []).extend(self._statements(code))

    def leave_room_for_helpers_after(self, stmt: ast.stmt) -> None:
        """Later transforms' helper functions (add_helper) go after `stmt`, after what is inserted there so far."""
        key = self.edits.at(stmt)
        self.edits.helper_slot = key, len(self.edits.after.get(key, []))

    def can_add_helpers(self) -> bool:
        """Does an earlier transform of this stage leave room for helper functions?"""
        return self.pending.helper_slot is not None

    def add_helper(self, name: str, code: str) -> None:
        """Ask for the function `name`, defined by `code`, in the room an earlier transform left (once, whoever asks)."""
        if name not in self.pending.helpers:
            self.edits.helpers[name] = self._statements(code)

    def append_to_module(self, code: str | Sequence[cst.BaseStatement]) -> None:
        self.edits.module_end.extend(self._statements(code))

    def rewrite_statement(self, stmt: ast.stmt, rewrite: StatementRewrite) -> None:
        """Replace a statement by what `rewrite(updated_cst_statement)` returns."""
        key = self.edits.at(stmt)
        previous = self.edits.rewrite.get(key)
        self.edits.in_place.discard(key)  # chained, it may return more than one statement
        self.edits.rewrite[key] = rewrite if previous is None else (lambda s, p=previous: _chain(p, rewrite, s))

    def rewrite_in_place(self, stmt: ast.stmt, rewrite: Callable[[cst.BaseStatement], cst.BaseStatement]) -> None:
        """Replace a statement by the one statement `rewrite` returns, which stands for it: the edits of a
        transform planned ahead of this one's (PLANS_AHEAD_OF) land on it."""
        alone = key_of(stmt) not in self.edits.rewrite
        self.rewrite_statement(stmt, lambda s: [rewrite(s)])
        if alone:
            self.edits.in_place.add(key_of(stmt))

    def rewrite_node(self, node: ast.AST, cst_type: type, rewrite: Callable[[cst.CSTNode], cst.CSTNode]) -> None:
        """Replace the CST node of `cst_type` that spans exactly what `node` spans."""
        pos = self.anatomy.pos(node)
        self.edits.expr[((pos.line, pos.col, pos.end_line, pos.end_col), cst_type)] = rewrite

    def rewrite_expression(self, node: ast.expr, rewrite: Callable[[cst.CSTNode], cst.CSTNode]) -> bool:
        """`rewrite_node` with the CST type that spells the ast expression's (False: none does, nothing queued)."""
        cst_type = cst_type_of(node)
        if cst_type is not None:
            self.rewrite_node(node, cst_type, rewrite)
        return cst_type is not None

    def guard_statement(self, stmt: ast.stmt, condition: str) -> None:
        """Put `stmt` under `if <condition>:`; neighbours guarded by the same condition share one `if`."""
        self.group_statement(stmt, ("if", condition), lambda run: guard(run, condition))

    def group_statement(self, stmt: ast.stmt, group: object, build: GroupBuilder) -> None:
        """Consecutive statements of the same `group` are replaced by `build(their CST statements)`."""
        self.edits.grouped[self.edits.at(stmt)] = (group, build)

    def _statements(self, code: str | Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """Inserted code as CST statements, its line breaks (docstrings included) the file's own."""
        if not isinstance(code, str):
            return list(code)
        return parse_statements(code.replace("\n", "\r\n") if "\r\n" in self.anatomy.text else code)

    def add_import(self, module: str, obj: str | None = None, asname: str | None = None) -> None:
        self.report.imports.append(Import(module, obj, asname))

    # ----- applying them ---------------------------------------------------------------------
    def transform_module(self, tree: cst.Module) -> cst.Module:
        """Plan from the anatomy first; only a transform with edits pays for a CST pass."""
        self.plan()
        return self.transform_module_impl(tree) if self.edits else tree

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        return self.edits.apply(tree, self.anatomy.tree)


def _chain(first: StatementRewrite, second: StatementRewrite, stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
    out: list[cst.BaseStatement] = []
    for s in first(stmt):
        out.extend(second(s))
    return out


class PlannedOnTheWrapsMade(Transform):
    """A transform whose plan reads the wrap's edits as the anatomy showing the pending DDP wraps made
    sees them (ddpify.anatomy.distributed.wraps_made): planned ahead of the wrap, its plan holds where
    every wrap could be shown; elsewhere it is planned again on the wrap's output."""

    SEES_EDITS_OF = ("wrap",)
    PLANS_AHEAD_OF = ("wrap",)
    SEES_WRAPS_MADE = True

    def reads_pending_edits(self, pending: PendingEdits) -> bool:
        return not self.anatomy.wraps_made
