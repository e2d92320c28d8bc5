"""Run transforms one after another, each on a fresh anatomy of the previous one's output.

Changes are reported against the lines of the user's original file: after each pass a line map
(from a diff of the pass's input and output) carries every line back to where it came from.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Sequence

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from ddpify.anatomy import analyze
from ddpify.codemods.base import Advice, Change, Import, Options, Transform


@dataclass
class ConversionResult:
    """The converted text and what was done to get it (lines refer to the original file)."""

    source: str
    output: str
    changes: list[Change] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    note: str = ""  # why nothing was done, when nothing was

    @property
    def changed(self) -> bool:
        return self.output != self.source

    @property
    def warnings(self) -> list[Advice]:
        return self.advice


def run_pipeline(text: str, path: str, transforms: Sequence[type[Transform]], options: Options) -> ConversionResult:
    """Apply `transforms` in order; each sees the anatomy of the code the previous one produced."""
    module = cst.parse_module(text)
    origin = list(range(1, _line_count(text) + 1))
    result = ConversionResult(source=text, output=text)
    imports: list[Import] = []
    code = text
    for transform_cls in transforms:
        pending = {i.local_name: i.qualified for i in imports}
        transform = transform_cls(CodemodContext(filename=path), analyze(code, path, pending_imports=pending), options)
        new_module = transform.transform_module(module)
        result.changes += [Change(_origin_line(origin, c.line), c.transform, c.message) for c in transform.report.changes]
        result.advice += [Advice(_origin_line(origin, a.line), a.message) for a in transform.report.advice]
        imports += [i for i in transform.report.imports if i not in imports]
        if new_module is not module:
            new_code = new_module.code
            origin = _carry_origins(origin, code, new_code)
            module, code = new_module, new_code
    if imports:
        module = _add_imports(module, imports)
    result.output = module.code
    result.changes.sort(key=lambda c: c.line)
    result.advice.sort(key=lambda a: a.line)
    return result


def _add_imports(module: cst.Module, imports: list[Import]) -> cst.Module:
    """One AddImportsVisitor pass for every import the transforms asked for."""
    context = CodemodContext()
    for i in imports:
        AddImportsVisitor.add_needed_import(context, i.module, i.obj, i.asname)
    return AddImportsVisitor(context).transform_module(module)


def _line_count(text: str) -> int:
    return len(text.splitlines()) or 1


def _origin_line(origin: list[int], line: int) -> int:
    return origin[min(max(line, 1), len(origin)) - 1] if origin else line


def _carry_origins(origin: list[int], old: str, new: str) -> list[int]:
    """Original line numbers for each line of `new`, given those of `old`."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
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
