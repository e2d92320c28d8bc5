"""The anatomy as pending DDP wraps will leave the code, for plans made in the same stage as the wrap.

`.module` access and rank 0's duties read the wrapper: which reads of a model hold it once the wrap
rebinds the model (`is_wrapper`, `wrapper_or_plain`), and whose forward then joins every rank; the
reseeds of each rank's noise and batches read where training starts after the last wrap. A
wrap only inserts statements (the SyncBatchNorm conversion, `model = DDP(model, ...)`) right after
the statement where its model is ready, or right before a `torch.compile` of it. `with_wraps_made`
is the anatomy of the code as it is, with those statements standing where the edits will put them:
their nodes join the walk, the bindings and the calls, on lines between the anchor's last and the
next statement's first (a fraction of a line apart), so every answer that orders by line sees them
after the anchor and before what follows, and a statement beside the anchor answers for them where
an answer asks which branch of an `if` holds them. Every answer found on the whole script is found
again on it. The code's own nodes keep their positions, so what a plan edits there is where it is.
Where the wrap would change what the value flow found (a variable gains a role: the model of a class
another file defines is a model once it is wrapped), or lines can't place its statements, there is
no such anatomy, and those plans wait for the wrap's output.
"""

from __future__ import annotations

import ast
import copy
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Sequence

from ddpify.anatomy.cache import forgetful_copy
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite, Pos
from ddpify.anatomy.tree import child_nodes

_SPREAD = 1000  # an inserted line's place between two lines of the code: line + its own line / _SPREAD


@dataclass(frozen=True)
class PendingWrap:
    """The statements a wrap inserts (`code`), after the statement `anchor`, or (`before`) ahead of it."""

    anchor: ast.stmt
    code: str
    before: bool = False


def with_wraps_made(a: Anatomy, wraps: Sequence[PendingWrap], imports: Mapping[str, str]) -> Anatomy | None:
    """`a` with each pending wrap's statements in place (`imports`: what the code they insert imports,
    local name -> qualified name, not imported yet), or None where lines can't place them: the
    anchor shares its line with a neighbour, or the code binds a name its function has not."""
    if not wraps or any(_shares_a_line(a, wrap) for wrap in wraps):
        return None
    made = _copy(a, imports)
    return made if all(_place(made, wrap) for wrap in wraps) else None


def _shares_a_line(a: Anatomy, wrap: PendingWrap) -> bool:
    """Is there a statement on the anchor's line, on the side where the wrap goes (`a; b`)?"""
    block = a.block_of(wrap.anchor)
    index = next(i for i, stmt in enumerate(block) if stmt is wrap.anchor)
    if wrap.before:
        return index > 0 and (block[index - 1].end_lineno or 0) >= wrap.anchor.lineno
    return index + 1 < len(block) and block[index + 1].lineno <= (wrap.anchor.end_lineno or wrap.anchor.lineno)


def _copy(a: Anatomy, imports: Mapping[str, str]) -> Anatomy:
    """A copy of the anatomy whose walk, calls and remembered answers can grow apart from `a`'s; what it
    found on the whole script (the per-anatomy facts, cached properties) is found again."""
    made = forgetful_copy(a)
    made.nodes, made.calls = list(a.nodes), list(a.calls)
    made.parents, made.scope_of, made.stmt_of = dict(a.parents), dict(a.scope_of), dict(a.stmt_of)
    made._qualnames, made._refs = dict(a._qualnames), dict(a._refs)
    made._settled_roles = None if a._settled_roles is None else dict(a._settled_roles)
    made.names = copy.copy(a.names)
    made.names.pending, made.names.aliases = {**a.names.pending, **imports}, {**a.names.aliases, **imports}
    made.stands_beside = {}
    made.wraps_made = True
    return made


def _place(made: Anatomy, wrap: PendingWrap) -> bool:
    """Walk the wrap's statements into the anatomy where the edit puts them; False where they bind a
    name that the function holding them does not bind (its locals would change)."""
    inserted = ast.parse(wrap.code).body
    anchor = wrap.anchor
    _renumber(inserted, anchor.lineno - 1 if wrap.before else (anchor.end_lineno or anchor.lineno))
    scope = made.scope_of.get(anchor, MODULE_SCOPE)
    function = made.functions.get(scope)
    stored = {n.id for stmt in inserted for n in ast.walk(stmt) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    if function is not None and not stored <= function.locals:
        return False
    for stmt in inserted:
        made.parents[stmt] = made.parents.get(anchor, made.tree)
        made.stands_beside[stmt] = anchor
        _walk_in(made, stmt, scope)
    return not any(_adds_roles(made, stmt) for stmt in inserted for stmt in ast.walk(stmt) if isinstance(stmt, ast.Assign))


def _adds_roles(made: Anatomy, assign: ast.Assign) -> bool:
    """Would the value flow give a variable the assignment binds a role it has not (a model whose class is
    another file's is a model once it is wrapped)? The answers found on its roles would change."""
    roles = made.roles(assign.value)
    return any(not roles <= made.values.get(made.ref(target), set()) for target in assign.targets)


def _renumber(statements: list[ast.stmt], line: int) -> None:
    """Give the parsed statements places between `line` and the next line of the code."""
    for stmt in statements:
        for node in ast.walk(stmt):
            if hasattr(node, "lineno"):
                node.lineno = line + node.lineno / _SPREAD
                node.end_lineno = line + (node.end_lineno or 0) / _SPREAD


def _walk_in(made: Anatomy, top: ast.stmt, scope: str) -> None:
    """The statement and its nodes join the walk (parents, scope, statement), the calls among them the call sites."""
    made.scope_of[top] = scope
    made.stmt_of[top] = top
    todo = deque([(top, top)])
    while todo:
        node, stmt = todo.popleft()
        made.nodes.append(node)
        if isinstance(node, ast.Call):
            made.calls.append(_call_site(made, node, stmt, scope))
        for child in child_nodes(node):
            made.parents[child] = node
            made.scope_of[child] = scope
            made.stmt_of[child] = child if isinstance(child, ast.stmt) else stmt
            todo.append((child, made.stmt_of[child]))


def _call_site(made: Anatomy, call: ast.Call, stmt: ast.stmt, scope: str) -> CallSite:
    qualname = made.qualname(call.func) or ""
    if isinstance(call.func, ast.Name) and call.func.id in made.functions:
        qualname = call.func.id
    pos = Pos(call.lineno, call.col_offset, call.end_lineno or call.lineno, call.end_col_offset or 0)  # type: ignore[arg-type]
    return CallSite(node=call, pos=pos, stmt=stmt, scope=scope, qualname=qualname)
