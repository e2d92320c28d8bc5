"""Add the imports the transforms asked for, as LibCST's AddImportsVisitor adds them, without its cost.

Same placement and text: after a module docstring (or `__strict__` flag) and the import lines that
open the module, `import x` (sorted), `import x as y`, then `from m import a, b as c` (aliased modules
first); a name the opening imports already bring is not added again, and a from-import whose module
an opening `from m import ...` names is merged into the first such line (new names first, sorted).
Building an AddImportsVisitor costs more than the rest of its work (its matcher set-up), once per file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Sequence

import libcst as cst
from libcst.helpers import get_absolute_module_from_package_for_import

from ddpify.codemods.report import Import


@dataclass
class _Imports:
    """Imports by kind, as AddImportsVisitor sorts them."""

    modules: set[str] = field(default_factory=set)  # import x
    module_aliases: dict[str, str] = field(default_factory=dict)  # import x as y
    objects: dict[str, set[str]] = field(default_factory=dict)  # from m import a ("*": all)
    object_aliases: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # from m import a as b

    def __bool__(self) -> bool:
        return bool(self.modules or self.module_aliases or self.objects or self.object_aliases)


def add_imports(module: cst.Module, imports: Sequence[Import]) -> cst.Module:
    """The module with `imports` added where the opening imports do not already bring them."""
    body = module.body
    start = 1 if body and _is_docstring_or_strict_flag(body[0]) else 0
    end = start
    while end < len(body) and _is_single_import(body[end]):
        end += 1
    opening = [stmt.body[0] for stmt in body[start:end]]  # type: ignore[attr-defined]
    needed = _without_present(_needed(imports), _gathered(opening))
    merged = [stmt.with_changes(body=[_merged(stmt.body[0], needed)]) for stmt in body[start:end]]  # type: ignore[attr-defined]
    if not needed:
        return module.with_changes(body=[*body[:start], *merged, *body[end:]])
    added = [_parsed_import(code, module.config_for_parsing) for code in _import_lines(needed)]
    return module.with_changes(body=[*body[:start], *merged, *added, *_blank_line_before(body[end:])])


@functools.lru_cache(maxsize=256)
def _parsed_import(code: str, config: cst.PartialParserConfig) -> cst.BaseStatement:
    """An import line, parsed once per text and parser config: conversions add the same few imports
    again and again (LibCST nodes are immutable, so one parse serves every file)."""
    return cst.parse_statement(code, config=config)


def _needed(imports: Sequence[Import]) -> _Imports:
    needed = _Imports()
    for i in imports:
        if i.obj is None and i.asname is None:
            needed.modules.add(i.module)
        elif i.obj is None:
            needed.module_aliases[i.module] = i.asname  # type: ignore[assignment]
    for module in sorted({i.module for i in imports if i.obj is not None and i.asname is None}):
        needed.objects[module] = {i.obj for i in imports if i.module == module and i.obj is not None and i.asname is None}  # type: ignore[misc]
    for module in sorted({i.module for i in imports if i.obj is not None and i.asname is not None}):
        needed.object_aliases[module] = [(i.obj, i.asname) for i in imports if i.module == module and i.obj is not None and i.asname is not None]  # type: ignore[misc]
    return needed


def _gathered(opening: Sequence[cst.BaseSmallStatement]) -> _Imports:
    """What the opening imports bring (relative imports, whose module is unknown, bring nothing)."""
    present = _Imports()
    for stmt in opening:
        if isinstance(stmt, cst.Import):
            for alias in stmt.names:
                if alias.asname is not None:
                    present.module_aliases[alias.evaluated_name] = alias.evaluated_alias  # type: ignore[assignment]
                else:
                    present.modules.add(alias.evaluated_name)
            continue
        module = get_absolute_module_from_package_for_import(None, stmt)  # type: ignore[arg-type]
        if module is None:
            continue
        if isinstance(stmt.names, cst.ImportStar):  # type: ignore[attr-defined]
            present.objects[module] = {"*"}
            continue
        names = stmt.names  # type: ignore[attr-defined]
        present.object_aliases.setdefault(module, []).extend(
            (a.evaluated_name, a.evaluated_alias) for a in names if a.asname is not None)
        present.objects.setdefault(module, set()).update(a.evaluated_name for a in names if a.asname is None)
    return present


def _without_present(needed: _Imports, present: _Imports) -> _Imports:
    needed.modules -= present.modules
    for module, alias in present.module_aliases.items():
        if needed.module_aliases.get(module) == alias:
            del needed.module_aliases[module]
    for module, pairs in present.object_aliases.items():
        for pair in pairs:
            if pair in needed.object_aliases.get(module, ()):
                needed.object_aliases[module].remove(pair)
                if not needed.object_aliases[module]:
                    del needed.object_aliases[module]
    for module, objects in present.objects.items():
        if module in needed.objects:
            needed.objects[module] = set() if "*" in objects else needed.objects[module] - objects
            if not needed.objects[module]:
                del needed.objects[module]
    return needed


def _merged(stmt: cst.BaseSmallStatement, needed: _Imports) -> cst.BaseSmallStatement:
    """An opening `from m import ...` with the names still needed from m put first (and no longer needed)."""
    if not isinstance(stmt, cst.ImportFrom) or isinstance(stmt.names, cst.ImportStar):
        return stmt
    module = get_absolute_module_from_package_for_import(None, stmt)
    if module is None or (module not in needed.objects and module not in needed.object_aliases):
        return stmt
    names = [cst.ImportAlias(name=cst.Name(obj)) for obj in sorted(needed.objects.pop(module, ()))]
    names += [cst.ImportAlias(name=cst.Name(obj), asname=cst.AsName(name=cst.Name(alias)))
              for obj, alias in sorted(needed.object_aliases.pop(module, ()))]
    return stmt.with_changes(names=[*names, *stmt.names])


def _import_lines(needed: _Imports) -> list[str]:
    by_module: dict[str, list[tuple[str, str | None]]] = {}
    for module, pairs in needed.object_aliases.items():
        by_module.setdefault(module, []).extend(pairs)
    for module, objects in needed.objects.items():
        by_module.setdefault(module, []).extend((obj, None) for obj in objects)
    return [*(f"import {module}" for module in sorted(needed.modules)),
            *(f"import {module} as {alias}" for module, alias in needed.module_aliases.items()),
            *(f"from {module} import " + ", ".join(obj if alias is None else f"{obj} as {alias}" for obj, alias in sorted(pairs))  # type: ignore[type-var]
              for module, pairs in by_module.items())]


def _blank_line_before(statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The statements after the imports, the first with an empty line above it (unless it has one)."""
    if not statements:
        return []
    first, leading = statements[0], statements[0].leading_lines  # type: ignore[attr-defined]
    if leading and leading[0].comment is None:
        return list(statements)
    return [first.with_changes(leading_lines=(cst.EmptyLine(), *leading)), *statements[1:]]


def _is_single_import(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))


def _is_docstring_or_strict_flag(stmt: cst.BaseStatement) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Expr):
        return isinstance(small.value, cst.SimpleString)
    return (isinstance(small, cst.Assign) and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == "__strict__")
