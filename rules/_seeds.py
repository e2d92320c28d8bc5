"""The seed rules' shared pieces: a finding for each unseeded RNG, and the fix that seeds them all
before the model is built with the helper convert inserts too (`ddpify.edits.seeding`)."""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy
from ddpify.anatomy.distributed.names import NUMPY, PYTHON, TORCH
from ddpify.anatomy.distributed.seeding import Unseeded
from ddpify.anatomy.syntax import spelling
from ddpify.edits.positions import last_leading_import
from ddpify.edits.seeding import SEED_CALL, SEED_HELPER, seed_helper
from ddpify.lint import Edit, Finding, Fix
from ddpify.rules._ddp import header_pos


def seed_finding(a: Anatomy, case: Unseeded) -> Finding:
    """The case reported where it starts (a compound statement: its first line), with the fix."""
    pos = header_pos(a, case.node) if isinstance(case.node, ast.stmt) else a.pos(case.node)
    return Finding(pos, message=case.message, fix=seed_helper_fix(a, case.model))


def seed_helper_fix(a: Anatomy, model: ast.stmt | None) -> Fix | None:
    """`seed_everything(0)` just before `model` is built, the helper defined after the imports (with
    `import random` when the script lacks it). None where the helper's name or `random` means
    something else here, or the model is built among the imports."""
    anchor = last_leading_import(a.tree)
    torch = spelling(a, TORCH)
    random_bound = a.names.aliases.get(PYTHON)
    if model is None or anchor is None or torch is None or SEED_HELPER in a.functions or random_bound not in (None, PYTHON):
        return None
    after_imports = anchor.end_lineno + 1  # type: ignore[operator]
    if model.lineno < after_imports:
        return None
    helper = ("" if random_bound else f"import {PYTHON}\n") + seed_helper(torch, spelling(a, NUMPY))
    helper += "\n" * max(0, 2 - _blank_lines_from(a, after_imports))  # two blank lines after the helper
    call = a.lines[model.lineno - 1][: model.col_offset] + SEED_CALL
    if model.lineno == after_imports:
        edits = (Edit.insert(model.lineno, 0, helper + call),)
    else:
        edits = (Edit.insert(after_imports, 0, helper), Edit.insert(model.lineno, 0, call))
    return Fix(edits, safe=False, description=f"seed every RNG with {SEED_HELPER}(0) before the model is built")


def _blank_lines_from(a: Anatomy, line: int) -> int:
    following = a.lines[line - 1:]
    return next((i for i, text in enumerate(following) if text.strip()), len(following))
