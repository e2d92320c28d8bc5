"""Run transforms one after another, each as if on the previous one's output.

The output is the one of running them one at a time, each on a fresh anatomy of the code the
previous one produced; but transforms whose plans do not read each other's edits are planned on one
anatomy and their edits made in one LibCST pass (a stage; see run_pipeline), so a conversion
analyses and rewrites the file a few times, not once per transform.

Analyses: the first stage plans on the anatomy the caller hands over (convert_source's, which the
project layer hands it in turn); each later stage analyses the code the stage before produced,
because its transforms read those edits (SEES_EDITS_OF) or edit the same statements; a stage that
made no edits is not analysed again. The analysis is not patched in place: an edit moves lines and
statements, and the roles, scopes and value flow of the code around it follow from the whole file.
A DDP or FSDP conversion typically has two stages, so with the lint of the output it analyses three
times. The second stage is the rank-0 duties' (with `.module` access for DDP where the wrapper
lacks what the model is read for, and FSDP's whole-model check, which read the wrap and the shard).
Planned on the input instead (tests/test_analyses_per_convert.py), rank 0 would misjudge:

- what evaluates to the DDP wrapper or the sharded model (anatomy.distributed's is_wrapper,
  is_sharded_model): rank-0-only code would call the wrapper, not `.module`, and a forward of the
  sharded model in a print's arguments (an all-gather) would stay under the guard;
- which calls join every rank because of collectives the first stage adds (every_rank_work's
  joins_by_itself): a printed `evaluate(model, loader)` whose loop the evaluation sharding follows
  by `all_reduce_sums` must run on every rank first, and a `with open(..., "w")` block around such
  work stays on every rank;
- and it would edit the statements other first-stage transforms edit (Edits.interferes_with sends
  it to a new stage anyway): the loss prints log-loss rewrites to `mean_over_ranks` values (in 46
  of the 114 scripts of bench/bench_convert.py's corpus when measured), the saves FSDP's state_dict
  transform rewrites (15), the `__main__` statements setup encloses in try/finally (2).

A single stage would need the first stage to hand these over in the input's terms: the wrap's plan
the names it binds to wrappers (or shards) and from which statement on, the evaluation and log-loss
plans the functions and statements that will call a collective (as ProjectFacts tells a file which
of another file's functions join every rank), every-rank judgements that take them, and an edit
engine that makes two rewrites of one statement in order. Where the setup's helpers go is handed
over already (add_helper, the room setup leaves).

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

from ddpify.anatomy import Anatomy, analyze
from ddpify.anatomy.facts import NO_FACTS, ProjectFacts
from ddpify.codemods.base import Transform
from ddpify.codemods.codegen import Renderer
from ddpify.codemods.duties import Duty
from ddpify.codemods.imports import add_imports
from ddpify.codemods.options import Options
from ddpify.codemods.report import Advice, Change, Import, Missing, Report
from ddpify.codemods.width import fit_to_width, width_limit
from ddpify.edits.engine import Edits


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
                 facts: ProjectFacts = NO_FACTS, owns_duties: bool = True, anatomy: Anatomy | None = None,
                 fit_width: bool = False) -> ConversionResult:
    """Apply `transforms` in order, each as if on the code the previous ones produced (and with `facts`,
    what the file's project says about it). A module a project's entry imports does not own the
    duties (wrap, shard): its entry does. `anatomy`: the text's, when the caller has it. `fit_width`:
    lay out again the lines the conversion made wider than the file's own (ddpify.codemods.width).

    Transforms are planned in stages, on one anatomy each, and a stage's edits are made in one pass.
    A transform starts a new stage when its plan reads the edits of one still pending (its
    SEES_EDITS_OF), or when its edits interfere with the stage's (Edits.interferes_with): then
    it is planned again on the code the stage produced. A transform that finds no work in the code
    (Transform.finds_work) is not planned at all. For DDP, typically: setup, devices, DataParallel
    removal and the wrap; then `.module` access (it reads the wrap), split, samplers, evaluation (it
    reads setup's helpers), log-loss (unless it waits for the evaluation helpers); rank 0 after the
    `.module` and log-loss edits; per-node downloads, where there are any, after the rank-0 guards.
    """
    conversion = _Conversion(text, path, facts, anatomy)
    stage = conversion.next_stage()
    for transform_cls in transforms:
        if not transform_cls.finds_work(stage.anatomy, options):
            continue
        if stage.pending_for(transform_cls):
            stage = conversion.make(stage)
        transform = stage.plan(transform_cls, options)
        if stage.edits.interferes_with(transform.edits, stage.anatomy):
            stage = conversion.make(stage)
            transform = stage.plan(transform_cls, options)
        stage.add(transform)
    conversion.finish(stage, last=True)
    if fit_width:
        conversion.fit_to_width()
    return conversion.result(owns_duties)


class _Stage:
    """Transforms planned on one anatomy, whose edits are made together in one pass."""

    def __init__(self, anatomy: Anatomy) -> None:
        self.anatomy = anatomy
        self.transforms: list[Transform] = []
        self.edits = Edits()

    def plan(self, transform_cls: type[Transform], options: Options) -> Transform:
        transform = transform_cls(None, self.anatomy, options, self.edits)
        transform.plan()
        return transform

    def add(self, transform: Transform) -> None:
        self.transforms.append(transform)
        self.edits.merge(transform.edits)

    def pending_for(self, transform_cls: type[Transform]) -> bool:
        """Does the transform's plan read edits (or imports) this stage has not made yet?"""
        seen = transform_cls.SEES_EDITS_OF
        return any((t.edits or t.report.imports) and (seen is None or t.NAME in seen) for t in self.transforms)


class _Conversion:
    """The code as the stages leave it, the line map to the original, and what the transforms reported."""

    def __init__(self, text: str, path: str, facts: ProjectFacts, anatomy: Anatomy | None) -> None:
        self.path, self.facts = path, facts
        self.module = cst.parse_module(text)
        self.code = text
        self.renderer = Renderer()
        self.origin = list(range(1, _line_count(text) + 1))
        self.original = self.latest = anatomy or analyze(text, path, facts=facts)
        self.output = ConversionResult(source=text, output=text)
        self.imports: list[Import] = []
        self.reports: list[tuple[Duty | None, Report]] = []

    def next_stage(self) -> _Stage:
        """A stage planned on the code as it is now, knowing the imports the transforms will add."""
        pending = {i.local_name: i.qualified for i in self.imports}
        if self.latest.text != self.code or self.latest.names.pending != pending:
            self.latest = analyze(self.code, self.path, pending_imports=pending, facts=self.facts)
        return _Stage(self.latest)

    def make(self, stage: _Stage) -> _Stage:
        """Make the stage's edits and start the next stage."""
        self.finish(stage)
        return self.next_stage()

    def finish(self, stage: _Stage, last: bool = False) -> None:
        """Report the stage's transforms and make its edits (the last stage adds every transform's imports too)."""
        for transform in stage.transforms:
            self._take_report(transform)
        module = stage.edits.apply(self.module, stage.anatomy.tree) if stage.edits else self.module
        self.output.missing += [Missing(_origin_line(self.origin, stmt.lineno), UNMADE, UNMADE_TODO) for stmt in stage.edits.unmade()]
        if last and self.imports:
            module = add_imports(module, self.imports)
        if module is not self.module:
            self._now(module, self.renderer.code(module))

    def fit_to_width(self) -> None:
        """Lay out again the statements whose lines the conversion made wider than the file's own
        (ddpify.codemods.width); the last step: the CST module is not kept in step with the text."""
        if self.code != self.output.source:
            limit = width_limit(self.output.source)
            self.code, self.origin = fit_to_width(self.code, self.origin, limit, self.module.default_indent)

    def _now(self, module: cst.Module, code: str) -> None:
        """The code is now `module`'s, whose text is `code`: carry the line map over to it."""
        self.origin = _carry_origins(self.origin, self.code, code)
        self.module, self.code = module, code

    def _take_report(self, transform: Transform) -> None:
        """The transform's report, its lines carried back to the original file."""
        report, out = transform.report, self.output
        self.reports.append((transform.DUTY, report))
        out.changes += [c.at(_origin_line(self.origin, c.line)) for c in report.changes]
        out.advice += [a.at(_origin_line(self.origin, a.line)) for a in report.advice]
        out.missing += [m.at(_origin_line(self.origin, m.line)) for m in report.missing]
        self.imports += [i for i in report.imports if i not in self.imports]

    def result(self, owns_duties: bool) -> ConversionResult:
        """The converted text, and every change, advice and missing item by original line."""
        result = self.output
        result.output, result.origins = self.code, self.origin
        result.missing += _undone_duties(self.original, self.reports) if owns_duties else []
        result.changes.sort(key=lambda c: c.line)
        result.advice.sort(key=lambda a: a.line)
        result.missing.sort(key=lambda m: m.line)
        return result


UNMADE = "ddpify planned an edit of this statement that it could not make"
UNMADE_TODO = "convert this statement by hand (and report it to ddpify, with the snippet: it is a bug)"


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


def _line_count(text: str) -> int:
    return len(text.splitlines()) or 1


def _origin_line(origin: list[int], line: int) -> int:
    return origin[min(max(line, 1), len(origin)) - 1] if origin else line


# Above this many lines the line map lets difflib pass over popular lines (blank lines, `return x`)
# when it looks for matches: without that heuristic its search is quadratic in them, the bulk of a
# 50,000-line conversion (bench/bench_scale.py); the lines reported for a generated 15,000-line
# script stay the same either way.
LONG_FILE_LINES = 2_000


def _carry_origins(origin: list[int], old: str, new: str) -> list[int]:
    """Original line numbers for each line of `new`, given those of `old` (a line moved into a new
    block, re-indented, is still the same line; so is a line rewritten in place)."""
    old_lines, new_lines = [line.strip() for line in old.splitlines()], [line.strip() for line in new.splitlines()]
    carried: list[int] = []
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=len(new_lines) > LONG_FILE_LINES)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            anchors = list(range(i1, i2))
        elif tag == "replace":
            anchors = _rewritten_anchors(old_lines, new_lines, i1, i2, j1, j2)
        else:  # inserted lines belong to the original line they precede
            anchors = [i1] * (j2 - j1)
        carried += [_origin_of(origin, anchor) for anchor in anchors]
    return carried or [1]


def _rewritten_anchors(old_lines: list[str], new_lines: list[str], i1: int, i2: int, j1: int, j2: int) -> list[int]:
    """For each new line of a replaced run, the old line it comes from: the most alike of those after
    the previous one's, and for an added line the old line it precedes (else the run's last)."""
    in_order = [i1 + min(offset, i2 - i1 - 1) for offset in range(j2 - j1)]
    if (i2 - i1) * (j2 - j1) > _MAX_PAIRS_COMPARED:
        return in_order
    anchors: list[int | None] = []
    first = i1
    for line in new_lines[j1:j2]:
        likeness = {i: difflib.SequenceMatcher(a=old_lines[i], b=line).ratio() for i in range(first, i2)}
        best = max(likeness, key=likeness.__getitem__, default=None)
        anchors.append(best if best is not None and likeness[best] >= _ALIKE else None)
        first = anchors[-1] + 1 if anchors[-1] is not None else first
    if not any(anchor is not None for anchor in anchors):
        return in_order
    following = i2 - 1
    for offset in reversed(range(len(anchors))):
        following = anchors[offset] = following if anchors[offset] is None else anchors[offset]  # type: ignore[assignment]
    return anchors  # type: ignore[return-value]


_ALIKE = 0.6  # difflib ratio from which a rewritten line counts as the old line it replaces
_MAX_PAIRS_COMPARED = 2_500


def _origin_of(origin: list[int], index: int) -> int:
    return origin[min(index, len(origin) - 1)] if origin else 1
