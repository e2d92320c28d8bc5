"""Helpers shared by the DDP rules (and the DataParallel rules, where the wrapper behaves alike):
finding ranges, what a state dict ends up in, and fix edits.

The facts themselves come from `ddpify.anatomy.distributed`; this module only turns them into
positions and source edits.
"""

from __future__ import annotations

import ast
from typing import Sequence

import libcst as cst

from ddpify.anatomy import Anatomy, Pos, ScriptKind, syntax
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.accelerate import accelerator_spelling, is_prepared_model, prepared_models
from ddpify.anatomy.distributed.ranks import is_rank_zero_test, mentions_rank, spawn_workers
from ddpify.anatomy.distributed.reaching import assignments
from ddpify.anatomy.distributed.wrappers import is_wrapper, wrap_calls
from ddpify.anatomy.vocabulary import ACCELERATOR_UNWRAP, TORCH_SAVE
from ddpify.edits.expressions import module_of, parse_expr, remove_keyword
from ddpify.edits.hoist import fresh_name, hoisted_names, hoisted_then_guarded
from ddpify.edits.statements import first_in_body, guard, parse_statements
from ddpify.lint import Edit, Fix
from ddpify.lint.rule import FAMILY_KINDS
from ddpify.lint.cst_fixes import expression_edit, statement_edit, statement_edit_with


# The scripts of the DDP rules that hold under Hugging Face Accelerate too (one process per device,
# the model wrapped by `accelerator.prepare`): ranks, collectives, rank-0 output, the wrapper's attributes.
DDP_AND_ACCELERATE = FAMILY_KINDS["DDP"] | {ScriptKind.ACCELERATE}


def header_pos(a: Anatomy, stmt: ast.stmt) -> Pos:
    """The first line of a compound statement (`for epoch in range(n):`), or the whole statement."""
    head = getattr(stmt, "iter", None) or getattr(stmt, "test", None)
    if head is None and isinstance(stmt, (ast.With, ast.AsyncWith)):
        head = stmt.items[-1].context_expr
    end = a.pos(head) if head is not None else a.pos(stmt)
    start = a.pos(stmt)
    return Pos(start.line, start.col, end.end_line, end.end_col)


def insert_at_top_of_body(a: Anatomy, compound: ast.stmt, code: str) -> Edit | None:
    """Insert the statement `code` as the first of a `for`/`if`/`with` body, as convert's
    `insert_at_body_start` does (after a docstring; a body on the header line is spread out first)."""
    return statement_edit(a, compound, lambda stmt: [first_in_body(stmt, parse_statements(code))])


def remove_keyword_fix(a: Anatomy, call: ast.Call, kw: ast.keyword, safe: bool, description: str) -> Fix | None:
    """Drop `kw=value` from the call, keeping its layout, with the codemods' `remove_keyword`."""
    edit = expression_edit(a, call, lambda node: remove_keyword(node, kw.arg))  # type: ignore[arg-type,return-value]
    return Fix((edit,), safe=safe, description=description) if edit else None


def module_fix(a: Anatomy, wrapper_expr: ast.AST, safe: bool, description: str) -> Fix | None:
    """`model.x` -> `model.module.x`, built by convert's `.module` rewrite (`module_of`); a model that
    `accelerator.prepare` wrapped is read through `accelerator.unwrap_model(model)` instead."""
    unwrap = _unwrap_model(a, wrapper_expr)
    inner = module_of if unwrap is None else lambda node: cst.Call(func=parse_expr(unwrap), args=[cst.Arg(node)])
    edit = expression_edit(a, wrapper_expr, inner)  # type: ignore[arg-type]
    return Fix((edit,), safe=safe, description=description) if edit else None


def inner_model(a: Anatomy, wrapper_expr: ast.AST) -> str:
    """How to name the model inside this wrapper: `model.module`, `accelerator.unwrap_model(model)`."""
    text = ast.get_source_segment(a.text, wrapper_expr) or ast.unparse(wrapper_expr)
    unwrap = _unwrap_model(a, wrapper_expr)
    return f"{text}.module" if unwrap is None else f"{unwrap}({text})"


def _unwrap_model(a: Anatomy, wrapper_expr: ast.AST) -> str | None:
    """`accelerator.unwrap_model` for a model `accelerator.prepare` wrapped; None for a DDP wrapper."""
    accelerator = accelerator_spelling(a, syntax.enclosing_function(a, wrapper_expr))
    return f"{accelerator}.{ACCELERATOR_UNWRAP}" if accelerator and is_prepared_model(a, wrapper_expr) else None


def is_ddp_wrapper(a: Anatomy, expr: ast.AST) -> bool:
    """A DDP wrapper: built by `DDP(model)`, or a model `accelerator.prepare` wrapped."""
    return is_wrapper(a, expr) or is_prepared_model(a, expr)


def wraps_models(a: Anatomy) -> bool:
    """Does the script wrap a model in DDP (itself, or with `accelerator.prepare`)?"""
    return bool(wrap_calls(a) or prepared_models(a))


def rank_zero_test(a: Anatomy, node: ast.AST) -> tuple[str, bool] | None:
    """Source text of a rank-0 test for a guard around `node`, and whether it is known to work there.

    The script's own test is reused when an earlier `if <rank-0 test>:` in the same function reads
    the same variables (known to work), or the script's Accelerator's `accelerator.is_main_process`;
    otherwise `dist.get_rank() == 0` (needs an initialised
    process group at that point, so not known to work). None when torch.distributed isn't spelled.
    """
    scope = syntax.enclosing_function(a, node)
    for branch in _rank_zero_guards(a):
        if syntax.enclosing_function(a, branch) == scope and branch.lineno < node.lineno:  # type: ignore[attr-defined]
            return ast.get_source_segment(a.text, branch.test) or "", True  # type: ignore[attr-defined]
    rank_variable = _global_rank_variable(a, scope, node.lineno)  # type: ignore[attr-defined]
    if rank_variable is not None:
        return f"{rank_variable} == 0", True
    accelerator = accelerator_spelling(a, scope)
    if accelerator is not None:
        return f"{accelerator}.is_main_process", True
    get_rank = syntax.spelling(a, "torch.distributed.get_rank")
    return (f"{get_rank}() == 0", False) if get_rank else None


@per_anatomy
def _rank_zero_guards(a: Anatomy) -> list[ast.If]:
    """`if <rank-0 test>:` statements whose one-line test a fix can copy."""
    return [
        n for n in a.nodes_of(ast.If)
        if not isinstance(n.test, ast.BoolOp) and is_rank_zero_test(a, n.test)
        and "\n" not in (ast.get_source_segment(a.text, n.test) or "\n")
    ]


def rank_zero_guard_fix(a: Anatomy, stmt: ast.stmt, may_be_safe: bool, hoisted: Sequence[ast.Call] = ()) -> Fix | None:
    """Put `stmt` under a rank-0 test with convert's `guard`, first computing the `hoisted` calls
    (work every rank joins) into fresh variables as convert does; safe only if `may_be_safe` and
    the test is known to work there."""
    test = rank_zero_test(a, stmt)
    if test is None:
        return None
    text, known = test
    taken: set[str] = set()
    names = hoisted_names(a, list(hoisted), lambda base: fresh_name(a, base, taken))
    if hoisted:
        edit = statement_edit_with(a, stmt, hoisted, lambda node, values: hoisted_then_guarded(node, list(zip(values, names)), text))
    else:
        edit = statement_edit(a, stmt, lambda node: [guard([node], text)])
    if edit is None:
        return None
    computed = f", after computing {', '.join(names)} on every rank" if names else ""
    return Fix((edit,), safe=may_be_safe and known, description=f"run it on rank 0 only (`if {text}:`){computed}")


def per_rank_target(a: Anatomy, *exprs: ast.AST | None, through_variables: bool = True) -> bool:
    """Do these arguments name their target after the rank (`f"ckpt_rank{rank}.pt"`, `print(f"[{rank}] ...")`)?"""
    return any(expr is not None and mentions_rank(a, expr, through_variables) for expr in exprs)


def is_saved(a: Anatomy, call: ast.Call) -> bool:
    """Inside `torch.save(...)`, or put into a variable (or a dict in one) that is saved later."""
    for parent, _ in syntax.ancestors(a, call):
        if isinstance(parent, ast.Call) and a.qualname(parent.func) == TORCH_SAVE:
            return True
        if isinstance(parent, ast.stmt):
            return _saved_later(a, parent)
    return False


def _saved_later(a: Anatomy, stmt: ast.stmt) -> bool:
    """Does a later `torch.save` in the same function save a variable that `stmt` assigns?"""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    names = {_base_name(t) for t in targets} - {None}
    scope = syntax.enclosing_function(a, stmt)
    return any(
        syntax.enclosing_function(a, save.node) == scope
        and save.line >= stmt.lineno
        and any(isinstance(n, ast.Name) and n.id in names for arg in save.node.args for n in ast.walk(arg))  # type: ignore[attr-defined]
        for save in a.calls_to(TORCH_SAVE)
    )


def _base_name(target: ast.AST | None) -> str | None:
    """`ckpt` for `ckpt`, `ckpt["model"]`, `ckpt.model`."""
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def call_arguments(call: ast.Call) -> list[ast.AST]:
    return [*call.args, *(kw.value for kw in call.keywords)]


def _global_rank_variable(a: Anatomy, scope: str, line: int) -> str | None:
    """A name holding the global rank in `scope` before `line`: a spawn worker's first parameter,
    or a variable assigned `dist.get_rank()` / `int(os.environ["RANK"])`."""
    if scope in spawn_workers(a):
        return a.functions[scope].params[0] if a.functions[scope].params else None
    for ref, entries in assignments(a).items():
        if ref.scope != scope or "." in ref.name:
            continue
        for stmt, value in entries:
            if stmt.lineno < line and syntax.enclosing_function(a, stmt) == scope and _is_global_rank(a, value):
                return ref.name
    return None


def _is_global_rank(a: Anatomy, value: ast.AST) -> bool:
    if isinstance(value, ast.Call) and syntax.identifier(value.func) == "int" and value.args:
        value = value.args[0]
    if isinstance(value, ast.Call):
        return a.qualname(value.func) == "torch.distributed.get_rank"
    return isinstance(value, ast.Subscript) and syntax.constant(value.slice, "RANK") and a.qualname(value.value) == "os.environ"
