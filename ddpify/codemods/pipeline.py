"""Run transforms one after another, each on a fresh anatomy of the previous one's output.

Changes are reported against the lines of the user's original file: after each pass a line map
(from a diff of the pass's input and output) carries every line back to where it came from.
The result ends in one Status: converted, nothing to do, or incomplete (what is missing, where,
and what to do by hand), decided from what the transforms reported and the duties they left undone.
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass, field
from typing import Sequence

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from ddpify.anatomy import Anatomy, analyze
from ddpify.anatomy.facts import NO_FACTS, ProjectFacts
from ddpify.codemods.base import Advice, Change, Duty, Import, Missing, Options, Report, Transform


class Status(enum.Enum):
    """How a conversion ended; every converted file ends in exactly one."""

    CONVERTED = "converted"
    NOTHING_TO_DO = "nothing to do"
    INCOMPLETE = "incomplete"


@dataclass
class ConversionResult:
    """The converted text and what was done to get it (lines refer to the original file)."""

    source: str
    output: str
    changes: list[Change] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)  # non-empty: the conversion is incomplete
    note: str = ""  # why nothing was done, when nothing was
    origins: list[int] = field(default_factory=list, repr=False)  # the original line of each output line

    def original_line(self, output_line: int) -> int:
        """The line of the original file that a line of the output comes from."""
        return _origin_line(self.origins, output_line)

    @property
    def changed(self) -> bool:
        return self.output != self.source

    @property
    def status(self) -> Status:
        if self.missing:
            return Status.INCOMPLETE
        return Status.CONVERTED if self.changed and not self.note else Status.NOTHING_TO_DO

    @property
    def reason(self) -> str:
        """One line saying why the status is what it is (the first missing item, or why nothing was done)."""
        if self.missing:
            more = f" (+{len(self.missing) - 1} more)" if len(self.missing) > 1 else ""
            return f"{self.missing[0].what} (line {self.missing[0].line}){more}"
        if self.status is Status.NOTHING_TO_DO:
            return self.note or "no changes needed"
        return f"{len(self.changes)} change{'s' if len(self.changes) != 1 else ''}"

    @property
    def warnings(self) -> list[Advice]:
        return self.advice


def run_pipeline(text: str, path: str, transforms: Sequence[type[Transform]], options: Options,
                 facts: ProjectFacts = NO_FACTS, owns_duties: bool = True) -> ConversionResult:
    """Apply `transforms` in order; each sees the anatomy of the code the previous one produced
    (and `facts`, what the file's project says about it). A module a project's entry imports does
    not own the duties (wrap, shard): its entry does."""
    module = cst.parse_module(text)
    origin = list(range(1, _line_count(text) + 1))
    result = ConversionResult(source=text, output=text)
    imports: list[Import] = []
    reports: list[tuple[Duty | None, Report]] = []
    original: Anatomy | None = None
    code = text
    for transform_cls in transforms:
        pending = {i.local_name: i.qualified for i in imports}
        anatomy = analyze(code, path, pending_imports=pending, facts=facts)
        original = original or anatomy
        transform = transform_cls(CodemodContext(filename=path), anatomy, options)
        new_module = transform.transform_module(module)
        reports.append((transform_cls.DUTY, transform.report))
        result.changes += [Change(_origin_line(origin, c.line), c.transform, c.message) for c in transform.report.changes]
        result.advice += [Advice(_origin_line(origin, a.line), a.message) for a in transform.report.advice]
        result.missing += [Missing(_origin_line(origin, m.line), m.what, m.todo) for m in transform.report.missing]
        imports += [i for i in transform.report.imports if i not in imports]
        if new_module is not module:
            new_code = new_module.code
            origin = _carry_origins(origin, code, new_code)
            module, code = new_module, new_code
    if imports:
        module = _add_imports(module, imports)
        origin = _carry_origins(origin, code, module.code)
    result.output, result.origins = module.code, origin
    result.missing += _undone_duties(original, reports) if owns_duties else []
    result.changes.sort(key=lambda c: c.line)
    result.advice.sort(key=lambda a: a.line)
    result.missing.sort(key=lambda m: m.line)
    return result


def _undone_duties(original: Anatomy, reports: list[tuple[Duty | None, Report]]) -> list[Missing]:
    """A Missing item for each duty that no transform fulfilled or explained (by reporting what it missed).

    Every duty must be done: sharding the data without wrapping the model (or the reverse) is an
    incomplete conversion, never a silent one.
    """
    done: dict[Duty, bool] = {}
    for duty, report in reports:
        if duty is not None:
            done[duty] = done.get(duty, False) or report.fulfilled or bool(report.missing)
    return [Missing(duty.anchor(original), duty.what, duty.todo) for duty, ok in done.items() if not ok]


def _add_imports(module: cst.Module, imports: list[Import]) -> cst.Module:
    """One AddImportsVisitor pass for every import the transforms asked for.

    The visitor reads and edits only the imports that open the module, but matches the whole body
    with a matcher that recurses once per statement (RecursionError from ~1,000 top-level
    statements). So it gets the opening statements and the one after them; the rest is put back.
    """
    context = CodemodContext()
    for i in imports:
        AddImportsVisitor.add_needed_import(context, i.module, i.obj, i.asname)
    head_size = _opening_imports_end(module.body) + 1
    head = AddImportsVisitor(context).transform_module(module.with_changes(body=module.body[:head_size]))
    return head.with_changes(body=[*head.body, *module.body[head_size:]])


def _opening_imports_end(body: Sequence[cst.BaseStatement]) -> int:
    """Index of the first statement after the module's first line (a docstring, say) and the import
    lines that follow it: the only statements AddImportsVisitor reads."""
    index = 1 if body and isinstance(body[0], cst.SimpleStatementLine) else 0
    while index < len(body) and _is_import_line(body[index]):
        index += 1
    return index


def _is_import_line(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body)


def _line_count(text: str) -> int:
    return len(text.splitlines()) or 1


def _origin_line(origin: list[int], line: int) -> int:
    return origin[min(max(line, 1), len(origin)) - 1] if origin else line


def _carry_origins(origin: list[int], old: str, new: str) -> list[int]:
    """Original line numbers for each line of `new`, given those of `old` (a line moved into a new
    block, re-indented, is still the same line)."""
    old_lines, new_lines = [line.strip() for line in old.splitlines()], [line.strip() for line in new.splitlines()]
    carried: list[int] = []
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for offset in range(j2 - j1):
            if tag == "equal":
                carried.append(origin[i1 + offset] if i1 + offset < len(origin) else i1 + offset + 1)
            else:  # inserted or rewritten lines belong to the original line they replace or precede
                anchor = min(i1 + min(offset, max(i2 - i1 - 1, 0)), len(origin) - 1)
                carried.append(origin[anchor] if origin else 1)
    return carried or [1]
