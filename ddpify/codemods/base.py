"""The pieces every codemod is made of: a Transform reads the anatomy, edits the CST at its positions.

The anatomy (built on `ast`) says *where* things are; the transform queues its `Edits` by (line,
column), and one plain CSTTransformer pass finds the CST nodes at those positions and rewrites them.
Statement-level surgery (insert after, wrap in a guard, ...) is applied when the pass leaves the
block that holds the statement, so transforms never juggle parents themselves.

A Transform has the shape of a thin LibCST `Codemod` (built with a context, `transform_module`), so
LibCST's `CodemodTest.assertCodemod` tests it; it does not subclass one: importing `libcst.codemod`
(its matchers) would add 0.14 s to the start of every `ddpify lint`, whose rules share these edits.
"""

from __future__ import annotations

import ast
import bisect
import functools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, ClassVar, Sequence, TypeVar

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpify.anatomy import Anatomy, Pos

if TYPE_CHECKING:
    from libcst.codemod import CodemodContext

Key = tuple[int, int]
Span = tuple[int, int, int, int]
StatementRewrite = Callable[[cst.BaseStatement], Sequence[cst.BaseStatement]]
GroupBuilder = Callable[[list[cst.BaseStatement]], cst.BaseStatement]


_Reported = TypeVar("_Reported", bound="Reported")


@dataclass(frozen=True)
class Reported:
    """What a transform reports, at a line of the code it was planned on."""

    line: int

    def at(self: _Reported, line: int) -> _Reported:
        """The same report at another line (the original file's, once the pipeline carries it back)."""
        return replace(self, line=line)


@dataclass(frozen=True)
class Change(Reported):
    """One rewrite, reported to the user: `train.py:42: [wrap] wrapped model in DDP`."""

    transform: str
    message: str


@dataclass(frozen=True)
class Advice(Reported):
    """Something the codemod could not do safely; the user must look at it by hand."""

    message: str


@dataclass(frozen=True)
class Missing(Reported):
    """Work the conversion needs but could not do: the result is incomplete until it is done by hand."""

    what: str  # "no model was wrapped in DistributedDataParallel"
    todo: str  # what to do by hand

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}; {self.todo}"


@dataclass(frozen=True)
class Duty:
    """What a conversion must achieve (wrap a model, shard the data); the transform that does it
    names it in `Transform.DUTY`, and a duty no transform fulfils leaves the result incomplete."""

    what: str  # said when it is not fulfilled
    todo: str
    anchor: Callable[[Anatomy], int]  # the line a missing item points at


def training_line(anatomy: Anatomy) -> int:
    """Where the script trains: its first optimizer, else its first backward()/step(), else line 1."""
    sites = anatomy.optimizers or anatomy.training_calls
    return sites[0].line if sites else 1


def wrap_duty(wrapper: str, ready: str, by_hand: str) -> Duty:
    """The duty of the transform that wraps each trained model in `wrapper` once it is `ready`."""
    return Duty(f"no model was wrapped in {wrapper} (found no model that an optimizer trains)",
                f"wrap the trained model by hand once it is {ready}: {by_hand}", training_line)


def data_line(anatomy: Anatomy) -> int:
    """Where the training data comes from: its first training loader, else any loader, else where it trains."""
    loaders = anatomy.train_loaders or anatomy.loaders
    return loaders[0].line if loaders else training_line(anatomy)


@dataclass
class Options:
    """What the user asked for on the command line."""

    batch_size: str = "per-gpu"  # or "global"
    eval: str = "shard"  # or "whole": every rank evaluates the full set
    log_loss: str = "reduced"  # or "rank0": training-loss prints show rank 0's shard only
    checkpoint: str = "full"  # --to fsdp: or "sharded": torch.distributed.checkpoint directories, a shard per rank
    mixed_precision: str = "keep"  # --to fsdp: or "policy": fully_shard(mp_policy=...) where the script autocasts


@dataclass(frozen=True)
class Import:
    """An import a transform needs; the pipeline adds them all in one pass at the end."""

    module: str
    obj: str | None = None
    asname: str | None = None

    @property
    def local_name(self) -> str:
        return self.asname or self.obj or self.module.split(".")[0]

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.obj}" if self.obj else self.module if self.asname else self.module.split(".")[0]


@dataclass
class Report:
    """What one transform did and what it left to the user (lines of its own input)."""

    changes: list[Change] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    imports: list[Import] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    fulfilled: bool = False  # the transform's DUTY was done at least once


def key_of(node: ast.AST | Pos) -> Key:
    """The (line, column) a CST node must start at to be the same node as this ast node/position."""
    if isinstance(node, Pos):
        return node.line, node.col
    return node.lineno, node.col_offset


def parse_statements(code: str) -> list[cst.BaseStatement]:
    """CST statements from source text (used for inserted code); leading comments stay attached."""
    return list(_parsed_statements(code))


@functools.lru_cache(maxsize=1024)
def _parsed_statements(code: str) -> tuple[cst.BaseStatement, ...]:
    """Parsed once per text: conversions insert the same few snippets again and again (LibCST nodes
    are immutable, so one parse can serve every insertion)."""
    module = cst.parse_module(code)
    body = list(module.body)
    if body and module.header:
        body[0] = body[0].with_changes(leading_lines=[*module.header, *body[0].leading_lines])
    return tuple(body)


def parse_expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def add_keyword(node: cst.CSTNode, keyword: str, value: str) -> cst.CSTNode:
    """The call with `keyword=value` appended, keeping its layout (and any trailing comma)."""
    assert isinstance(node, cst.Call)
    new = cst.Arg(keyword=cst.Name(keyword), value=parse_expr(value),
                  equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
    if not node.args:
        return node.with_changes(args=[new])
    args = list(node.args)
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # trailing comma: keep the call's own layout
        separator = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(whitespace_after=node.whitespace_before_args)
        args[-1] = last.with_changes(comma=separator)
        return node.with_changes(args=[*args, new.with_changes(comma=last.comma)])
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return node.with_changes(args=[*args, new])


def remove_keyword(node: cst.CSTNode, keyword: str) -> cst.CSTNode:
    """The call without its `keyword=` argument, keeping its layout (a last argument's trailing
    comma, or its absence, passes to the argument before it)."""
    assert isinstance(node, cst.Call)
    args = list(node.args)
    index = next(i for i, arg in enumerate(args) if arg.keyword is not None and arg.keyword.value == keyword)
    removed = args.pop(index)
    if index == len(args) and args:
        args[-1] = args[-1].with_changes(comma=removed.comma)
    return node.with_changes(args=args)


@dataclass
class Edits:
    """The edits a transform queued, keyed by positions in its input; `apply` makes them in one LibCST pass."""

    before: dict[Key, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[Key, list[cst.BaseStatement]] = field(default_factory=dict)
    rewrite: dict[Key, StatementRewrite] = field(default_factory=dict)
    body_start: dict[Key, list[cst.BaseStatement]] = field(default_factory=dict)
    module_end: list[cst.BaseStatement] = field(default_factory=list)
    expr: dict[tuple[Span, type], Callable[[cst.CSTNode], cst.CSTNode]] = field(default_factory=dict)
    grouped: dict[Key, tuple[object, GroupBuilder]] = field(default_factory=dict)
    statements: dict[Key, ast.stmt] = field(default_factory=dict)  # each statement the edits above touch
    # where the helper functions of later transforms go: after a statement, at a place among its insertions
    helper_slot: tuple[Key, int] | None = None
    helpers: dict[str, list[cst.BaseStatement]] = field(default_factory=dict)  # by function name, in order

    def __bool__(self) -> bool:
        return any((self.before, self.after, self.rewrite, self.body_start, self.module_end, self.expr, self.grouped, self.helpers))

    def at(self, stmt: ast.stmt) -> Key:
        """The key of a statement an edit touches (remembered, to tell whether edits interact)."""
        key = key_of(stmt)
        self.statements[key] = stmt
        return key

    def interferes_with(self, later: Edits, anatomy: Anatomy) -> bool:
        """Would making `later` (planned on the same code) in the same pass as these give other code than
        making it after these? It would when both touch one statement, when one groups statements of a
        block where the other edits statements (an insertion splits a group, or lands inside it), and
        when an expression rewrite lies within another's rewritten expression or statement."""
        if not self or not later:
            return False
        return bool(self.statements.keys() & later.statements.keys()
                    or self._beside_groups(anatomy) & later._edited_places(anatomy)
                    or later._beside_groups(anatomy) & self._edited_places(anatomy)
                    or self._encloses_rewrites_of(later) or later._encloses_rewrites_of(self))

    def merge(self, later: Edits) -> None:
        """Take in the edits of a later transform that does not interfere with these."""
        for mine, theirs in ((self.before, later.before), (self.after, later.after), (self.rewrite, later.rewrite),
                             (self.body_start, later.body_start), (self.expr, later.expr), (self.grouped, later.grouped),
                             (self.statements, later.statements)):
            mine.update(theirs)  # type: ignore[attr-defined]
        self.module_end.extend(later.module_end)
        self._place_helpers(later.helpers)
        self.helper_slot = self.helper_slot or later.helper_slot

    def _place_helpers(self, helpers: dict[str, list[cst.BaseStatement]]) -> None:
        """The helper functions a later transform asks for, those not asked for yet, into the slot (where
        they land as they would if that transform were planned on the code with these edits made)."""
        new = {name: code for name, code in helpers.items() if name not in self.helpers}
        if not new:
            return
        if self.helper_slot is None:
            raise ValueError(f"helpers {sorted(new)} asked for in a stage that leaves no room for them")
        key, index = self.helper_slot
        statements = [stmt for code in new.values() for stmt in code]
        self.after[key][index:index] = statements
        self.helper_slot = key, index + len(statements)
        self.helpers.update(new)

    def _beside_groups(self, anatomy: Anatomy) -> set[Place]:
        """The places of grouped statements and of their neighbours: an edit there could split a group or land in it."""
        places = [_place(anatomy, self.statements[key]) for key in self.grouped]
        return {(parent, block, index + step) for parent, block, index in places for step in (-1, 0, 1)}

    def _edited_places(self, anatomy: Anatomy) -> set[Place]:
        keys = self.before.keys() | self.after.keys() | self.rewrite.keys() | self.grouped.keys()
        return {_place(anatomy, self.statements[key]) for key in keys}

    def _encloses_rewrites_of(self, other: Edits) -> bool:
        """Does one of these expression or statement rewrites contain an expression `other` rewrites or a
        statement it edits? (Statements compare by whole lines: ast and LibCST count columns apart.)"""
        outer = [(span[:2], span[2:]) for span, _ in self.expr]
        outer += [_lines_of(s) for key, s in self.statements.items() if key in self.rewrite]
        inner = [(span[:2], span[2:]) for span, _ in other.expr] + [_lines_of(s) for s in other.statements.values()]
        return any(start <= first and last <= end for start, end in outer for first, last in inner)

    def apply(self, module: cst.Module, tree: ast.Module) -> cst.Module:
        """The module with every queued edit made (the queues are used up); `tree`: the ast of the same code."""
        return module.visit(_EditApplier(self, tree))

    def touches_statements(self, stmts: Sequence[ast.stmt]) -> bool:
        """Does an edit insert at, rewrite or group one of these statements?"""
        keys = {key_of(stmt) for stmt in stmts}
        return any(keys & queue.keys() for queue in (self.before, self.after, self.rewrite, self.body_start, self.grouped))

    def unmade(self) -> list[ast.stmt]:
        """After `apply`: the statements whose edits it could not make, because it found no statement
        of the code where they were planned (none is expected: a conversion reports them missing)."""
        left = self.before.keys() | self.after.keys() | self.rewrite.keys() | self.body_start.keys() | self.grouped.keys()
        return sorted((self.statements[key] for key in left), key=key_of)


class Transform:
    """Base of every rewrite step. Subclasses say what they do in their docstring, set NAME and override `plan()`."""

    NAME: ClassVar[str] = ""
    DUTY: ClassVar[Duty | None] = None
    # NAMEs of the earlier transforms whose edits this one's plan reads (it is planned on the code
    # they produced); None: every earlier transform's. The others' edits may still be pending.
    SEES_EDITS_OF: ClassVar[tuple[str, ...] | None] = None

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

    def models_to_wrap(self, wrapper: str) -> list:
        """The trained models this file wraps in `wrapper`. Each optimizer whose model the analysis cannot
        bind trains a model left unwrapped: a missing item, unless another file of the project binds that
        model to an optimizer and wraps it there (then, with no model here, the duty is done there)."""
        models = self.anatomy.trained_models
        if self.anatomy.facts.models_trained_elsewhere:
            if not models:
                self.fulfil()
            return models
        unbound = self.anatomy.trained_models_unbound
        named = {used_at for _, used_at in unbound}  # optimizers whose missing models are named below
        for optimizer in self.anatomy.optimizers_without_model:
            if optimizer.node not in named:
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
        self.edits.rewrite[key] = rewrite if previous is None else (lambda s, p=previous: _chain(p, rewrite, s))

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


_CST_TYPES: dict[type, type] = {
    ast.Name: cst.Name, ast.Attribute: cst.Attribute, ast.Call: cst.Call, ast.Subscript: cst.Subscript,
    ast.BinOp: cst.BinaryOperation, ast.BoolOp: cst.BooleanOperation, ast.UnaryOp: cst.UnaryOperation,
    ast.Compare: cst.Comparison, ast.IfExp: cst.IfExp, ast.ListComp: cst.ListComp, ast.JoinedStr: cst.FormattedString,
    ast.SetComp: cst.SetComp, ast.DictComp: cst.DictComp,
}
_CONSTANT_TYPES: dict[type, type] = {str: cst.SimpleString, int: cst.Integer, float: cst.Float, bool: cst.Name, type(None): cst.Name}


def cst_type_of(node: ast.AST) -> type | None:
    """The LibCST type of the node that spells the ast expression `node` (an edit is keyed by span
    and type); None where no one type does."""
    if isinstance(node, ast.Constant):
        return _CONSTANT_TYPES.get(type(node.value))
    return _CST_TYPES.get(type(node))


class _EditApplier(cst.CSTTransformer):
    """One pass over the tree that makes the queued edits. Statements are located by the ast statements
    of the same code, block by block as the pass goes down; the expressions of a statement, only when
    an expression rewrite lies on its lines, by LibCST positions in a module of that statement alone."""

    def __init__(self, edits: Edits, tree: ast.Module) -> None:
        super().__init__()
        self.edits = edits
        self.tree = tree
        self.module = cst.Module(body=[])
        self.statements: dict[cst.CSTNode, tuple[ast.stmt, ast.stmt]] = {}  # first and last ast statement of each
        self.holders: list[tuple[cst.CSTNode, bool]] = []  # statements being visited; has an expression edit on its lines?
        self.indents: list[str | None] = []  # of the blocks being visited
        self.spans: dict[cst.CSTNode, Span] = {}
        self.spread: dict[cst.SimpleStatementSuite, Sequence[ast.stmt]] = {}  # one-line bodies that hold an edited statement
        self.shared_lines: dict[cst.SimpleStatementLine, Sequence[ast.stmt]] = {}  # lines `a; b`, with their statements
        keys = [*edits.before, *edits.after, *edits.rewrite, *edits.body_start, *edits.grouped, *(span for span, _ in edits.expr)]
        self.edited_lines = sorted({key[0] for key in keys})
        self.expr_lines = sorted({span[0] for span, _ in edits.expr})

    def visit_Module(self, node: cst.Module) -> bool:
        self.module = node
        self._match_statements(node.body, self.tree.body)
        return True

    def on_visit(self, node: cst.CSTNode) -> bool:
        """Statements with no edit on their lines are left as they are, unvisited; so are the
        expressions of a statement with no expression rewrite on its lines."""
        if isinstance(node, cst.BaseExpression) and self.holders and not self.holders[-1][1]:
            return False
        place = self.statements.get(node) if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) else None
        if place is not None:
            lines = place[0].lineno, place[1].end_lineno or place[1].lineno
            if not _any_within(self.edited_lines, *lines):
                return False
            self.holders.append((node, _any_within(self.expr_lines, _decorators_line(place[0]), lines[1])))
            if isinstance(node, cst.BaseCompoundStatement):
                for suite, stmts in compound_bodies(node, place[0]):
                    if isinstance(suite, cst.IndentedBlock):
                        self._match_statements(suite.body, stmts)
                    elif self.edits.touches_statements(stmts):
                        self.spread[suite] = stmts
        return super().on_visit(node)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite, updated_node: cst.SimpleStatementSuite) -> cst.BaseSuite:
        """A body on its header's line (`if c: a; b`) with a statement to edit: one statement a line, then edited."""
        stmts = self.spread.pop(original_node, None)
        if stmts is None:
            return updated_node
        lines = self._one_statement_a_line(updated_node, stmts)
        return cst.IndentedBlock(body=self._apply_to_block(lines, lines))

    def _one_statement_a_line(self, holder: cst.SimpleStatementLine | cst.SimpleStatementSuite, stmts: Sequence[ast.stmt]) -> list[cst.BaseStatement]:
        lines = one_statement_a_line(holder)
        for line, stmt in zip(lines, stmts):
            self.statements[line] = (stmt, stmt)
        return lines

    def _spread_shared_lines(self, originals: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]) -> tuple[list, list]:
        """Lines `a; b` with an edit on a statement after the first, or a statement to group (guard):
        one statement a line, so the edit lands on that statement alone. (A rewrite of the first
        statement is a rewrite of the whole line.)"""
        spread_originals: list[cst.BaseStatement] = []
        spread_updated: list[cst.BaseStatement] = []
        for orig, new in zip(originals, updated):
            stmts = self.shared_lines.get(orig)  # type: ignore[call-overload]
            if stmts and (self.edits.touches_statements(stmts[1:]) or any(key_of(stmt) in self.edits.grouped for stmt in stmts)):
                lines = self._one_statement_a_line(new, stmts)  # type: ignore[arg-type]
                spread_originals += lines
                spread_updated += lines
            else:
                spread_originals.append(orig)
                spread_updated.append(new)
        return spread_originals, spread_updated

    def _match_statements(self, statements: Sequence[cst.BaseStatement], stmts: Sequence[ast.stmt]) -> None:
        """Pair each CST statement of a block with its ast statements (a line `a; b` holds several)."""
        index = 0
        for node in statements:
            size = len(node.body) if isinstance(node, cst.SimpleStatementLine) else 1
            self.statements[node] = (stmts[index], stmts[index + size - 1])
            if size > 1:
                self.shared_lines[node] = stmts[index:index + size]
            index += size

    def _span(self, node: cst.CSTNode) -> Span:
        if node not in self.spans:
            self._locate_expressions(self.holders[-1][0])
        return self.spans[node]

    def _locate_expressions(self, stmt: cst.CSTNode) -> None:
        """The spans of a statement's expressions (a compound's outside its indented body, whose statements
        are located on their own)."""
        first_line = self.statements[stmt][0].lineno
        self.spans.update(spans_in_place(stmt, first_line, self.indents[::-1], self.module))  # type: ignore[arg-type]

    def _key(self, node: cst.CSTNode) -> Key:
        return key_of(self.statements[node][0])

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[override]
        if self.holders and self.holders[-1][0] is original_node:
            self.holders.pop()
        updated = super().on_leave(original_node, updated_node)
        if self.expr_lines and isinstance(original_node, cst.BaseExpression) and self.holders[-1][1]:
            rewrite = self.edits.expr.get((self._span(original_node), type(original_node)))
            if rewrite is not None:
                return rewrite(updated)  # type: ignore[arg-type]
        return updated

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> bool:
        self.indents.append(node.indent)
        return True

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._apply_to_block(original_node.body, updated_node.body) + self.edits.module_end
        return updated_node.with_changes(body=body)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        self.indents.pop()
        return updated_node.with_changes(body=self._apply_to_block(original_node.body, updated_node.body))

    def _apply_to_block(self, originals: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        if self.shared_lines:
            originals, updated = self._spread_shared_lines(originals, updated)
        out: list[cst.BaseStatement] = []
        run: list[cst.BaseStatement] = []  # consecutive statements of one group
        run_group: tuple[object, GroupBuilder] | None = None
        trailing: list[cst.BaseStatement] = []
        for orig, new in zip(originals, updated):
            key = self._key(orig)
            group = self.edits.grouped.pop(key, None)
            if run and (group is None or group[0] != run_group[0]):  # type: ignore[index]
                out.append(run_group[1](run))  # type: ignore[index]
                out.extend(trailing)
                run, trailing = [], []
            before = self.edits.before.pop(key, [])
            produced = self._produce(key, new)
            after = self.edits.after.pop(key, [])
            if group is None:
                out.extend([*before, *produced, *after])
                continue
            (run if run else out).extend(before)
            run.extend(produced)
            trailing.extend(after)
            run_group = group
        if run:
            out.append(run_group[1](run))  # type: ignore[index]
            out.extend(trailing)
        return out

    def _produce(self, key: Key, new: cst.BaseStatement) -> list[cst.BaseStatement]:
        new = self._with_body_start(key, new)
        rewrite = self.edits.rewrite.pop(key, None)
        produced = list(rewrite(new)) if rewrite else [new]
        if produced and produced[0] is not new:
            produced[0] = keep_leading_lines(new, produced[0])
        return produced

    def _with_body_start(self, key: Key, stmt: cst.BaseStatement) -> cst.BaseStatement:
        extra = self.edits.body_start.pop(key, None)
        return first_in_body(stmt, extra) if extra else stmt


def _any_within(lines: list[int], first: int, last: int) -> bool:
    """Does the sorted `lines` hold a line from `first` to `last`?"""
    index = bisect.bisect_left(lines, first)
    return index < len(lines) and lines[index] <= last


def _decorators_line(stmt: ast.stmt) -> int:
    """The first line of a statement and its decorators (ast starts a decorated def at `def`)."""
    return min([stmt.lineno, *(decorator.lineno for decorator in getattr(stmt, "decorator_list", ()))])


def spans_in_place(stmt: cst.BaseStatement, first_line: int, indents: Sequence[str | None], module: cst.Module) -> dict[cst.CSTNode, Span]:
    """The spans in the file of the nodes of a statement of a block (of a compound one, outside an
    indented body that ends it), whose first line is `first_line`: read in a module of just that
    statement, nested in stand-ins at its indentation (`indents`: of the blocks around it, innermost first)."""
    alone = _without_indented_body(stmt)
    nested: cst.CSTNode = alone
    for indent in indents:
        nested = cst.If(test=cst.Name("_"), body=cst.IndentedBlock(body=[nested], indent=indent))  # type: ignore[list-item]
    alone_module = cst.Module(body=[nested], default_indent=module.default_indent, default_newline=module.default_newline)  # type: ignore[list-item]
    positions = MetadataWrapper(alone_module, unsafe_skip_copy=True).resolve(PositionProvider)
    shift = first_line - positions[alone].start.line
    return {node: (where.start.line + shift, where.start.column, where.end.line + shift, where.end.column) for node, where in positions.items()}


def _without_indented_body(stmt: cst.CSTNode) -> cst.CSTNode:
    """A compound statement whose indented body ends it with `pass` for that body (others as they are)."""
    ends = not any(getattr(stmt, part, None) for part in ("orelse", "handlers", "finalbody"))
    if ends and isinstance(getattr(stmt, "body", None), cst.IndentedBlock):
        return stmt.with_changes(body=cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])]))
    return stmt


def compound_bodies(node: cst.BaseCompoundStatement, stmt: ast.stmt) -> list[tuple[cst.BaseSuite, Sequence[ast.stmt]]]:
    """The bodies of a compound statement, each with its ast statements: body, except handlers,
    match cases, else, finally, and those of the `elif`s it leads."""
    if isinstance(node, cst.Match):
        pairs = [(case.body, ast_case.body) for case, ast_case in zip(node.cases, stmt.cases)]  # type: ignore[attr-defined]
    else:
        pairs = [(node.body, stmt.body)]  # type: ignore[attr-defined]
        pairs += [(handler.body, ast_handler.body) for handler, ast_handler in zip(getattr(node, "handlers", ()), getattr(stmt, "handlers", ()))]
    orelse, finalbody = getattr(node, "orelse", None), getattr(node, "finalbody", None)
    if orelse is not None and not isinstance(orelse, cst.If):
        pairs.append((orelse.body, stmt.orelse))  # type: ignore[attr-defined]
    if finalbody is not None:
        pairs.append((finalbody.body, stmt.finalbody))  # type: ignore[attr-defined]
    return pairs + compound_bodies(orelse, stmt.orelse[0]) if isinstance(orelse, cst.If) else pairs  # type: ignore[attr-defined]


def first_in_body(compound: cst.BaseStatement, stmts: Sequence[cst.BaseStatement]) -> cst.BaseStatement:
    """`compound` with `stmts` as the first statements of its body (after a docstring); a body on
    its header line (`for x in y: a; b`) is spread out first, one statement a line."""
    block = getattr(compound, "body", None)
    if isinstance(block, cst.SimpleStatementSuite):
        block = cst.IndentedBlock(body=one_statement_a_line(block))
    if not isinstance(block, cst.IndentedBlock):
        return compound
    head = 1 if block.body and _is_docstring(block.body[0]) else 0
    return compound.with_changes(body=block.with_changes(body=[*block.body[:head], *stmts, *block.body[head:]]))  # type: ignore[attr-defined]


def one_statement_a_line(holder: cst.SimpleStatementLine | cst.SimpleStatementSuite) -> list[cst.BaseStatement]:
    """The statements of `a; b` (a line, or the body of `if x: a; b`) on lines of their own; the
    comments above stay above the first, the comment after stays after the last."""
    last = len(holder.body) - 1
    lines: list[cst.BaseStatement] = [
        cst.SimpleStatementLine(
            body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)],
            trailing_whitespace=holder.trailing_whitespace if i == last else cst.TrailingWhitespace(),
        )
        for i, small in enumerate(holder.body)
    ]
    lines[0] = lines[0].with_changes(leading_lines=getattr(holder, "leading_lines", ()))
    return lines


Place = tuple[int, str, int]  # a statement's parent (its id), the parent's field holding the block, its index


def _place(anatomy: Anatomy, stmt: ast.stmt) -> Place:
    parent, block, index = anatomy.place_of(stmt)
    return id(parent), block, index


def _lines_of(stmt: ast.stmt) -> tuple[Key, Key]:
    """The whole lines a statement spans, as (start, end) positions."""
    return (stmt.lineno, 0), (stmt.end_lineno or stmt.lineno, 1 << 30)


def _chain(first: StatementRewrite, second: StatementRewrite, stmt: cst.BaseStatement) -> list[cst.BaseStatement]:
    out: list[cst.BaseStatement] = []
    for s in first(stmt):
        out.extend(second(s))
    return out


def keep_leading_lines(old: cst.BaseStatement, new: cst.BaseStatement) -> cst.BaseStatement:
    """Comments and blank lines above a replaced statement stay above its replacement."""
    leading = getattr(old, "leading_lines", None)
    if leading is None or not hasattr(new, "leading_lines") or new.leading_lines:  # type: ignore[attr-defined]
        return new
    return new.with_changes(leading_lines=leading)  # type: ignore[attr-defined]


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def guard(stmts: Sequence[cst.BaseStatement], condition: str) -> cst.If:
    """`if <condition>:` around statements, keeping the first one's comments above the `if`."""
    return enclose(stmts, f"if {condition}:\n    pass\n")  # type: ignore[return-value]


def enclose(stmts: Sequence[cst.BaseStatement], compound: str) -> cst.BaseCompoundStatement:
    """The compound statement `compound` (whose first body is `pass`) with `stmts` as that body,
    keeping the first statement's comments above the compound."""
    first = stmts[0]
    leading = getattr(first, "leading_lines", ())
    body = [first.with_changes(leading_lines=()) if leading else first, *stmts[1:]]  # type: ignore[attr-defined]
    header = parse_statements(compound)[0]
    return header.with_changes(body=cst.IndentedBlock(body=body), leading_lines=leading)  # type: ignore[return-value]
