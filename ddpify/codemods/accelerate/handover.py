"""The entry script hands its Accelerator to the project's modules that use it.

One Accelerator per process: the models and optimizers one prepares are the ones its backward scales
and its save and unwrap_model know, so the modules the entry imports use the entry's (a module
declares `accelerator: Accelerator | None = None`: ddpify.codemods.accelerate.library). The entry
imports each such module and sets it there right after building its own:

    import utils
    accelerator = Accelerator(...)
    utils.accelerator = accelerator

An entry that builds no Accelerator leaves those modules missing it: the conversion is incomplete.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Protocol, Sequence

from ddpify.anatomy.project import import_roots, within
from ddpify.codemods.accelerate.runtime import ACCELERATOR
from ddpify.codemods.pipeline import ConversionResult
from ddpify.codemods.report import Change, Missing


class ProjectFile(Protocol):
    """One file of a project conversion, as the hand-over reads it (project_conversion's FileJob)."""

    path: Path
    entry: bool
    result: ConversionResult | None

HANDOVER_COMMENT = f"# ddpify: the project's modules use this process's one {ACCELERATOR}\n"


def hand_over_accelerator(jobs: Sequence[ProjectFile]) -> None:
    """Each entry of the project hands its Accelerator to the modules waiting for it; where an entry
    builds none, those modules are missing it."""
    waiting = [job for job in jobs if not job.entry and job.result is not None and awaits_accelerator(job.result.output)]
    entries = [job for job in jobs if job.entry and job.result is not None]
    for entry in entries if waiting else ():
        if not _hand_over(entry.result, [_module_name(job.path, entry.path) for job in waiting]):  # type: ignore[arg-type]
            for job in waiting:
                job.result.missing.append(Missing(1, f"this module uses the {ACCELERATOR} of the entry script {entry.path.name}, "  # type: ignore[union-attr]
                                                     "which builds none that ddpify could hand over",
                                                  f"set `{_module_name(job.path, entry.path)}.{ACCELERATOR} = {ACCELERATOR}` "
                                                  "in the entry script once its Accelerator is built"))


def awaits_accelerator(code: str) -> bool:
    """Does the module declare the Accelerator the entry hands over (`accelerator: Accelerator | None = None`)?"""
    return any(isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == ACCELERATOR
               and isinstance(stmt.value, ast.Constant) and stmt.value.value is None for stmt in ast.parse(code).body)


def _hand_over(result: ConversionResult, modules: list[str | None]) -> bool:
    """`import module` with the entry's imports, `module.accelerator = accelerator` after its Accelerator
    is built (False: no Accelerator built at module level, or a module it can't name)."""
    tree = ast.parse(result.output)
    built = next((stmt for stmt in tree.body if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                  and [ast.unparse(t) for t in stmt.targets] == [ACCELERATOR]), None)
    imports = [stmt for stmt in tree.body if isinstance(stmt, (ast.Import, ast.ImportFrom)) and built and stmt.lineno < built.lineno]
    if built is None or not imports or None in modules:
        return False
    imported = {alias.name for stmt in imports if isinstance(stmt, ast.Import) for alias in stmt.names if alias.asname is None}
    _insert(result, built.end_lineno, [HANDOVER_COMMENT] + [f"{m}.{ACCELERATOR} = {ACCELERATOR}\n" for m in modules])  # type: ignore[arg-type]
    _insert(result, imports[-1].end_lineno, [f"import {m}\n" for m in modules if m not in imported])  # type: ignore[arg-type]
    line = result.original_line(built.lineno)
    result.changes.append(Change(line, "accelerator", f"{ACCELERATOR} handed over to {', '.join(modules)}: "  # type: ignore[arg-type]
                                                      "one per process, shared by the project's modules"))
    return True


def _insert(result: ConversionResult, after: int, lines: list[str]) -> None:
    """Insert `lines` into the output after its line `after`, each from the original line that one comes from."""
    text = result.output.splitlines(keepends=True)
    result.output = "".join(text[:after] + lines + text[after:])
    if result.origins:
        result.origins[after:after] = [result.original_line(after)] * len(lines)


def _module_name(path: Path, entry: Path) -> str | None:
    """How the entry imports the module at `path` (`utils`, `trainer.core`), from the first of its import roots that holds it."""
    for root in import_roots(entry):
        relative = within(path, root)
        if not relative.parts or relative.parts[0] == "..":
            continue
        parts = list(relative.with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return None
