"""The edit engine: transforms queue `Edits` by (line, column) of the code they planned on, and one
plain CSTTransformer pass finds the CST nodes at those positions and rewrites them.

Statement-level surgery (insert before or after, rewrite, put first in a body, group under a guard)
is applied when the pass leaves the block that holds the statement, so an edit never juggles
parents itself. Edits of several transforms planned on the same code merge into one pass when they
do not interfere (`Edits.interferes_with`). A transform planned ahead of edits it would read
(Transform.PLANS_AHEAD_OF) has its edits made in the same pass as a second layer (`Edits.then`):
each block is edited by the first layer, then by the second, whose edits of a statement the first
rewrote in place land on what that rewrite returned, as if planned on the code the first produced.
"""

from __future__ import annotations

import ast
import bisect
from dataclasses import dataclass, field
from typing import Callable, Sequence

import libcst as cst

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.every_rank_work import PendingEdits
from ddpify.anatomy.distributed.wraps_made import PendingWrap
from ddpify.edits.positions import Key, Span, decorators_line, key_of, spans_in_place
from ddpify.edits.statements import StatementRewrite, compound_bodies, first_in_body, keep_leading_lines, names_bound, one_statement_a_line

GroupBuilder = Callable[[list[cst.BaseStatement]], cst.BaseStatement]
Place = tuple[int, str, int]  # a statement's parent (its id), the parent's field holding the block, its index
Keyed = tuple[Key | None, cst.BaseStatement]  # a statement of a block being edited, and the key its edits have (None: added)


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
    in_place: set[Key] = field(default_factory=set)  # statements rewritten into one that stands for each
    then: Edits | None = None  # the edits of transforms planned ahead of these, made after them (merge_after)
    # the DDP wraps these insert, for plans that see them made (wraps_made); unlisted: some wrap is not among them
    wraps: list[PendingWrap] = field(default_factory=list)
    wraps_unlisted: bool = False
    fresh: set[str] = field(default_factory=set)  # the names these edits bind that the code did not use (Transform.fresh_name)

    def __bool__(self) -> bool:
        return any((self.before, self.after, self.rewrite, self.body_start, self.module_end, self.expr, self.grouped, self.helpers, self.then))

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
                    or self._encloses_rewrites_of(later) or later._encloses_rewrites_of(self)
                    or (self.then is not None and self.then.interferes_with(later, anatomy)))

    def can_come_after(self, ahead: Edits) -> bool:
        """Can `ahead`, planned on the same code as if these were made, be made after these in the same
        pass (merge_after)? Not where it edits a statement these group or rewrite (unless in place:
        its edits land on what the rewrite returned), nor where one of its expression rewrites lies
        within a statement these rewrite or an expression these rewrite: a rewrite of these would
        then be made on its output, not the other way round."""
        shared = self.statements.keys() & ahead.statements.keys()
        if any(key in self.grouped or (key in self.rewrite and key not in self.in_place) for key in shared):
            return False
        outer = [(span[:2], span[2:]) for span, _ in self.expr]
        outer += [_lines_of(s) for key, s in self.statements.items() if key in self.rewrite]
        inner = [(span[:2], span[2:]) for span, _ in ahead.expr]
        inner += [_lines_of(s) for key, s in ahead.statements.items() if key not in self.statements]
        return not any(start <= first and last <= end for start, end in outer for first, last in inner)

    def merge(self, later: Edits) -> None:
        """Take in the edits of a later transform that does not interfere with these (into the last layer)."""
        self._place_helpers(later.helpers)
        last = self.then or self
        for mine, theirs in ((last.before, later.before), (last.after, later.after), (last.rewrite, later.rewrite),
                             (last.body_start, later.body_start), (last.expr, later.expr), (last.grouped, later.grouped),
                             (last.statements, later.statements)):
            mine.update(theirs)  # type: ignore[attr-defined]
        last.module_end.extend(later.module_end)
        last.in_place |= later.in_place
        last.fresh |= later.fresh
        self.helper_slot = self.helper_slot or later.helper_slot
        self._take_wraps(later)

    def merge_after(self, ahead: Edits) -> None:
        """Take in the edits of a transform planned ahead of these (can_come_after): made after them, as
        a second layer; the helper functions it asks for go in the room these leave."""
        self._place_helpers(ahead.helpers)
        ahead.helpers = {}
        self.then = ahead
        self._take_wraps(ahead)

    def _take_wraps(self, other: Edits) -> None:
        self.wraps += other.wraps
        self.wraps_unlisted = self.wraps_unlisted or other.wraps_unlisted

    def edits_code_not_made(self) -> bool:
        """Do these edits touch statements a plan saw made ahead of their edit (wraps_made, between two lines of the code)?"""
        lines = [key[0] for key in self.statements] + [span[0] for span, _ in self.expr]
        return any(not isinstance(line, int) for line in lines)

    def as_pending(self) -> PendingEdits:
        """What these edits touch, as the judgements of a transform planned ahead of them read it."""
        others = self.after.keys() | self.body_start.keys() | self.grouped.keys()  # an insertion before it is made outside it
        return PendingEdits(statements=frozenset(self.statements.values()),
                            in_place=frozenset(self.statements[key] for key in self.in_place - others),
                            expression_lines=frozenset(line for span, _ in self.expr for line in range(span[0], span[2] + 1)))

    @staticmethod
    def pending_of(edits: Sequence[Edits]) -> PendingEdits:
        """What the edits of several transforms touch, together (as_pending)."""
        each = [e.as_pending() for e in edits]
        return PendingEdits(statements=frozenset().union(*(p.statements for p in each)),
                            in_place=frozenset().union(*(p.in_place for p in each)),
                            expression_lines=frozenset().union(*(p.expression_lines for p in each)))

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
        """Does an edit (of either layer) insert at, rewrite or group one of these statements?"""
        keys = {key_of(stmt) for stmt in stmts}
        return any(keys & queue.keys() for layer in self.layers() for queue in (layer.before, layer.after, layer.rewrite, layer.body_start, layer.grouped))

    def groups_any(self, stmts: Sequence[ast.stmt]) -> bool:
        return any(key_of(stmt) in layer.grouped for layer in self.layers() for stmt in stmts)

    def names_added(self) -> set[str]:
        """The variables these edits may add to the code: those chosen fresh, and those the statements
        and helpers they insert bind (a rewrite binds no other; what the inserted code reads is bound
        there, by the script, or by an import)."""
        names: set[str] = set()
        for layer in self.layers():
            inserted = [*layer.module_end, *(s for stmts in (*layer.before.values(), *layer.after.values(),
                                                              *layer.body_start.values(), *layer.helpers.values()) for s in stmts)]
            names |= layer.fresh | {name for stmt in inserted for name in names_bound(stmt)}
        return names

    def layers(self) -> list[Edits]:
        """These edits, then those made after them in the same pass."""
        return [self] if self.then is None else [self, self.then]

    def unmade(self) -> list[ast.stmt]:
        """After `apply`: the statements whose edits it could not make, because it found no statement
        of the code where they were planned (none is expected: a conversion reports them missing)."""
        left = [(layer, key) for layer in self.layers()
                for key in layer.before.keys() | layer.after.keys() | layer.rewrite.keys() | layer.body_start.keys() | layer.grouped.keys()]
        return sorted((layer.statements[key] for layer, key in left), key=key_of)


class _EditApplier(cst.CSTTransformer):
    """One pass over the tree that makes the queued edits. Statements are located by the ast statements
    of the same code, block by block as the pass goes down; the expressions of a statement, only when
    an expression rewrite lies on its lines, by LibCST positions in a module of that statement alone."""

    def __init__(self, edits: Edits, tree: ast.Module) -> None:
        super().__init__()
        self.layers = edits.layers()
        self.edits = edits
        self.tree = tree
        self.module = cst.Module(body=[])
        self.statements: dict[cst.CSTNode, tuple[ast.stmt, ast.stmt]] = {}  # first and last ast statement of each
        self.holders: list[tuple[cst.CSTNode, bool]] = []  # statements being visited; has an expression edit on its lines?
        self.indents: list[str | None] = []  # of the blocks being visited
        self.spans: dict[cst.CSTNode, Span] = {}
        self.spread: dict[cst.SimpleStatementSuite, Sequence[ast.stmt]] = {}  # one-line bodies that hold an edited statement
        self.shared_lines: dict[cst.SimpleStatementLine, Sequence[ast.stmt]] = {}  # lines `a; b`, with their statements
        self.expr = {span: rewrite for layer in self.layers for span, rewrite in layer.expr.items()}
        keys = [key for layer in self.layers for key in (*layer.before, *layer.after, *layer.rewrite, *layer.body_start, *layer.grouped)]
        self.edited_lines = sorted({key[0] for key in [*keys, *(span for span, _ in self.expr)]})
        self.expr_lines = sorted({span[0] for span, _ in self.expr})

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
            bodies = compound_bodies(node, place[0]) if isinstance(node, cst.BaseCompoundStatement) else []
            self.holders.append((node, self._rewrites_own_expressions(decorators_line(place[0]), lines[1], bodies)))
            for suite, stmts in bodies:
                if isinstance(suite, cst.IndentedBlock):
                    self._match_statements(suite.body, stmts)
                elif self.edits.touches_statements(stmts):
                    self.spread[suite] = stmts
        return super().on_visit(node)

    def _rewrites_own_expressions(self, first: int, last: int, bodies: list[tuple[cst.BaseSuite, Sequence[ast.stmt]]]) -> bool:
        """Is an expression rewrite on the statement's lines outside the statements of its indented
        bodies (which hold their own)? A compound's header is located only then."""
        lines = self.expr_lines[bisect.bisect_left(self.expr_lines, first):bisect.bisect_right(self.expr_lines, last)]
        blocks = [(decorators_line(stmts[0]), stmts[-1].end_lineno or stmts[-1].lineno)
                  for suite, stmts in bodies if isinstance(suite, cst.IndentedBlock) and stmts]
        return any(not any(start <= line <= end for start, end in blocks) for line in lines)

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
            if stmts and (self.edits.touches_statements(stmts[1:]) or self.edits.groups_any(stmts)):
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
            rewrite = self.expr.get((self._span(original_node), type(original_node)))
            if rewrite is not None:
                return rewrite(updated)  # type: ignore[arg-type]
        return updated

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> bool:
        self.indents.append(node.indent)
        return True

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._apply_to_block(original_node.body, updated_node.body) + [s for layer in self.layers for s in layer.module_end]
        return updated_node.with_changes(body=body)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        self.indents.pop()
        return updated_node.with_changes(body=self._apply_to_block(original_node.body, updated_node.body))

    def _apply_to_block(self, originals: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        if self.shared_lines:
            originals, updated = self._spread_shared_lines(originals, updated)
        block: list[Keyed] = [(self._key(orig), new) for orig, new in zip(originals, updated)]
        for layer in self.layers:
            block = _edit_block(layer, block)
        return [stmt for _, stmt in block]


def _edit_block(edits: Edits, block: list[Keyed]) -> list[Keyed]:
    """A block's statements with one layer's edits made. What a statement becomes keeps its key when
    it is one statement (a later layer's edits land on it); what is added or grouped has none."""
    out: list[Keyed] = []
    run: list[cst.BaseStatement] = []  # consecutive statements of one group
    run_group: tuple[object, GroupBuilder] | None = None
    trailing: list[Keyed] = []
    for key, new in block:
        group = edits.grouped.pop(key, None)  # type: ignore[arg-type]
        if run and (group is None or group[0] != run_group[0]):  # type: ignore[index]
            out.append((None, run_group[1](run)))  # type: ignore[index]
            out.extend(trailing)
            run, trailing = [], []
        before = [(None, stmt) for stmt in edits.before.pop(key, [])]  # type: ignore[arg-type]
        produced = _produce(edits, key, new)
        after = [(None, stmt) for stmt in edits.after.pop(key, [])]  # type: ignore[arg-type]
        if group is None:
            out.extend([*before, *((key if len(produced) == 1 else None, stmt) for stmt in produced), *after])
            continue
        if run:
            run.extend(stmt for _, stmt in before)
        else:
            out.extend(before)
        run.extend(produced)
        trailing.extend(after)
        run_group = group
    if run:
        out.append((None, run_group[1](run)))  # type: ignore[index]
        out.extend(trailing)
    return out


def _produce(edits: Edits, key: Key | None, new: cst.BaseStatement) -> list[cst.BaseStatement]:
    extra = edits.body_start.pop(key, None)  # type: ignore[arg-type]
    new = first_in_body(new, extra) if extra else new
    rewrite = edits.rewrite.pop(key, None)  # type: ignore[arg-type]
    produced = list(rewrite(new)) if rewrite else [new]
    if produced and produced[0] is not new:
        produced[0] = keep_leading_lines(new, produced[0])
    return produced


def _any_within(lines: list[int], first: int, last: int) -> bool:
    """Does the sorted `lines` hold a line from `first` to `last`?"""
    index = bisect.bisect_left(lines, first)
    return index < len(lines) and lines[index] <= last


def _place(anatomy: Anatomy, stmt: ast.stmt) -> Place:
    parent, block, index = anatomy.place_of(stmt)
    return id(parent), block, index


def _lines_of(stmt: ast.stmt) -> tuple[Key, Key]:
    """The whole lines a statement spans, as (start, end) positions."""
    return (stmt.lineno, 0), (stmt.end_lineno or stmt.lineno, 1 << 30)
