"""Values hoisted out of a statement before it is guarded: `print(f"{evaluate(m):.4f}")`, whose
evaluation every rank must run, becomes `evaluate_result = evaluate(m)` on every rank and the
print under a rank condition. The rank-0 transform and the rule that finds such prints share it."""

from __future__ import annotations

import ast
from typing import Callable, Sequence

import libcst as cst

from ddpify.anatomy.distributed.every_rank_work import must_run_on_every_rank
from ddpify.anatomy.syntax import identifier
from ddpify.edits.statements import guard


def fresh_name(anatomy, base: str, taken: set[str]) -> str:
    """`base`, or `base1`, `base2`, ...: a name the script doesn't use yet (added to `taken`)."""
    used = {n.id for n in anatomy.nodes_of(ast.Name)} | taken  # type: ignore[attr-defined]
    name = next(f"{base}{i or ''}" for i in range(len(used) + 1) if f"{base}{i or ''}" not in used)
    taken.add(name)
    return name


def hoisted_names(anatomy, values: Sequence[ast.expr], fresh: Callable[[str], str]) -> list[str]:
    """A fresh variable for each hoisted value (`fresh` makes a name fresh), after the first call in it
    that must run on every rank: `evaluate(...)` -> `evaluate_result`, `[round(evaluate(m), 2) for m
    in ms]` -> `evaluate_results`."""
    return [fresh(_hoisted_name(anatomy, value)) for value in values]


def _hoisted_name(anatomy, value: ast.expr) -> str:
    calls = [n for n in ast.walk(value) if isinstance(n, ast.Call)]
    call = next((c for c in calls if must_run_on_every_rank(anatomy, c)), calls[0] if calls else None)
    stem = identifier(call.func) if call is not None else None
    plural = isinstance(value, (ast.ListComp, ast.SetComp, ast.DictComp))
    return f"{stem or 'value'}_result{'s' if plural else ''}"


def hoisted_then_guarded(stmt: cst.BaseStatement, hoists: list[tuple[cst.CSTNode, str]], condition: str) -> list[cst.BaseStatement]:
    """`print(f"{evaluate(m):.4f}")` -> `evaluate_result = evaluate(m)`, then the statement under
    `if <condition>:` reading `evaluate_result`; its comments stay above the first assignment."""
    assigns: list[cst.BaseStatement] = [
        cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)]) for value, name in hoists  # type: ignore[arg-type]
    ]
    stmt = stmt.visit(_ReplaceNodes({id(value): cst.Name(name) for value, name in hoists}))  # type: ignore[assignment]
    assigns[0] = assigns[0].with_changes(leading_lines=getattr(stmt, "leading_lines", ()))
    return [*assigns, guard([stmt.with_changes(leading_lines=())], condition)]


class _ReplaceNodes(cst.CSTTransformer):
    """Replaces nodes (by identity) in one pass: `deep_replace` copies the nodes around the one it replaces."""

    def __init__(self, new_by_id: dict[int, cst.CSTNode]) -> None:
        super().__init__()
        self.new_by_id = new_by_id

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[override]
        return self.new_by_id.get(id(original_node), updated_node)
