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

The rank-0 duties read the edits of the setup, the wrap (or shard), devices, the evaluation sharding
and log-loss, yet are planned ahead of them, on the same anatomy (Transform.PLANS_AHEAD_OF), where
those edits change nothing their plan reads: the pending edits are handed over as facts
(Edits.as_pending), and every statement rank 0 judged must be judged alike once they are made
(anatomy.distributed.every_rank_work's judged_alike_once_made: it reads no model, which the wrap
makes a wrapper (unless its anatomy shows the wraps made, below) or the shard a sharded model; no
edit touches it or a local function it calls, where a collective may be added; an edit of the
statement itself is a rewrite in place, as log-loss's of a loss print, of an output whose calls only
read); a value it hoists goes into a name fresh in their output too (Transform.fresh_name). Its edits
are then made in the same pass, after theirs (Edits.merge_after: an edit of a statement rewritten in
place lands on what the rewrite returned; a statement they insert splits rank 0's guards). A DDP or
FSDP conversion of a plain script is then one stage, and with the lint of the output analysed twice
(tests/test_analyses_per_convert.py). Elsewhere rank 0 waits for a second stage: a print of
`evaluate(model, loader)` reads the model FSDP's shard shards (a forward of the sharded model is an
all-gather) or a DDP wrap the anatomy can't show made (below), and a function the evaluation
sharding makes call `all_reduce_sums` (so it must run on every rank first); it waits for FSDP's
checkpoint, state-dict and parameter rewrites where they have work, and for setup's try/finally
around the `__main__` statements it guards (Edits.can_come_after). The wrapper itself is no reason
to wait: `.module` access, rank 0 and the reseeds of each rank's noise and batches (which go where
training starts after the last wrap) plan on an anatomy that shows the pending DDP wraps made
(Transform.SEES_WRAPS_MADE, ddpify.anatomy.distributed.wraps_made), where every wrap can be shown
(not a dict of models wrapped one by one, nor a model whose class another file defines); and rank 0
judges only the pending edits its plan reads (SEES_EDITS_OF): `.module` access's rewrites are made
as if after its plan. A transform planned ahead whose edits do not interfere with those pending
joins their layer, so the layer after stays free for rank 0.

Changes are reported against the lines of the user's original file: after each pass a line map
(from a diff of the pass's input and output) carries every line back to where it came from.
The result ends in one Status: converted, nothing to do, or incomplete (what is missing, where,
and what to do by hand), decided from what the transforms reported and the duties they left undone.
"""

from __future__ import annotations

import ast
import difflib
import enum
from dataclasses import dataclass, field
from typing import Callable, Sequence

import libcst as cst

from ddpify.anatomy import Anatomy, analyze
from ddpify.anatomy.distributed.every_rank_work import PendingEdits
from ddpify.anatomy.distributed.wraps_made import with_wraps_made
from ddpify.anatomy.facts import NO_FACTS, ProjectFacts
from ddpify.codemods.base import Transform
from ddpify.codemods.codegen import Renderer
from ddpify.codemods.duties import Duty
from ddpify.codemods.imports import add_imports
from ddpify.codemods.options import Options
from ddpify.codemods.report import Advice, Change, Import, Missing, Report
from ddpify.codemods.width import fit_to_width, width_limit
from ddpify.edits.engine import Edits

# What is still missing in a conversion's output, judged on the output's parse (convert.lint_leftovers).
Check = Callable[["ConversionResult", ast.Module, str], "list[Missing]"]


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
                 fit_width: bool = False, check: Check | None = None) -> ConversionResult:
    """Apply `transforms` in order, each as if on the code the previous ones produced (and with `facts`,
    what the file's project says about it). A module a project's entry imports does not own the
    duties (wrap, shard): its entry does. `anatomy`: the text's, when the caller has it. `fit_width`:
    lay out again the lines the conversion made wider than the file's own (ddpify.codemods.width).
    `check`: what is still missing in the output (its lint), judged before the lines are laid out
    again (the same statements, one parse of the output for both).

    Transforms are planned in stages, on one anatomy each, and a stage's edits are made in one pass.
    A transform starts a new stage when its plan reads the edits of one still pending (its
    SEES_EDITS_OF), or when its edits interfere with the stage's (Edits.interferes_with): then
    it is planned again on the code the stage produced; unless it can be planned ahead of the edits
    it reads (PLANS_AHEAD_OF, _Stage.plan_ahead), its edits made after them in the same pass. A
    transform that finds no work in the code (Transform.finds_work) is not planned at all. For
    DDP, typically: setup, devices, DataParallel removal, the wrap, `.module` access (seeing the wrap
    made), samplers, evaluation, log-loss and rank 0 (planned ahead) in one stage; per-node downloads,
    where there are any, after the rank-0 guards.
    """
    conversion = _Conversion(text, path, facts, anatomy)
    stage = conversion.next_stage()
    for transform_cls in transforms:
        if not transform_cls.finds_work(stage.anatomy, options):
            continue
        ahead = stage.pending_for(transform_cls)
        transform = stage.plan_ahead(transform_cls, options) if ahead else stage.plan(transform_cls, options)
        if transform is None or (not ahead and stage.edits.interferes_with(transform.edits, stage.anatomy)):
            stage = conversion.make(stage)
            transform, ahead = stage.plan(transform_cls, options), False
        stage.add(transform, ahead)
    conversion.finish(stage, last=True)
    result = conversion.result(owns_duties)
    tree = ast.parse(result.output, filename=path) if result.changed and (check or fit_width) else None
    if check and tree is not None:
        result.missing = sorted([*result.missing, *check(result, tree, path)], key=lambda m: m.line)
    if fit_width and tree is not None:
        conversion.fit_to_width(tree)
        result.output, result.origins = conversion.code, conversion.origin
    return result


class _Stage:
    """Transforms planned on one anatomy, whose edits are made together in one pass."""

    def __init__(self, anatomy: Anatomy) -> None:
        self.anatomy = anatomy
        self.transforms: list[Transform] = []
        self.edits = Edits()
        self._wraps_made: tuple[int, Anatomy] | None = None  # (how many wraps it shows, the anatomy)

    def plan(self, transform_cls: type[Transform], options: Options) -> Transform:
        transform = transform_cls(None, self._anatomy_for(transform_cls), options, self.edits)
        transform.plan()
        return transform

    def _anatomy_for(self, transform_cls: type[Transform]) -> Anatomy:
        """The stage's anatomy; for a transform that sees the wraps made (SEES_WRAPS_MADE), the one that
        shows the pending DDP wraps made, where every wrap is listed and lines can place them."""
        wraps = self.edits.wraps
        if not (transform_cls.SEES_WRAPS_MADE and wraps) or self.edits.wraps_unlisted:
            return self.anatomy
        if self._wraps_made is None or self._wraps_made[0] != len(wraps):
            imports = {i.local_name: i.qualified for t in self.transforms for i in t.report.imports}
            self._wraps_made = len(wraps), with_wraps_made(self.anatomy, wraps, imports) or self.anatomy
        return self._wraps_made[1]

    def plan_ahead(self, transform_cls: type[Transform], options: Options) -> Transform | None:
        """The transform planned on this stage's code though it reads edits still pending here, which it
        takes as facts (its PLANS_AHEAD_OF); None where it must wait for them: it waits for others, its
        plan reads what they change, or its edits can't be made after them in the same pass."""
        if self.edits.then is not None or not set(self._waited_for(transform_cls)) <= set(transform_cls.PLANS_AHEAD_OF):
            return None
        transform = self.plan(transform_cls, options)
        if transform.reads_pending_edits(self._pending_read_by(transform_cls)) or transform.edits.edits_code_not_made():
            return None
        if not self.edits.can_come_after(transform.edits):
            return None
        return transform

    def add(self, transform: Transform, ahead: bool = False) -> None:
        """Take in a transform's edits: after those pending when it was planned ahead of them, unless
        they do not interfere (then the order of the two makes the same code, and the layer after
        stays free for a transform planned ahead later)."""
        self.transforms.append(transform)
        if ahead and self.edits.interferes_with(transform.edits, self.anatomy):
            self.edits.merge_after(transform.edits)
        else:
            self.edits.merge(transform.edits)

    def _pending_read_by(self, transform_cls: type[Transform]) -> PendingEdits:
        """What the pending edits its plan reads (SEES_EDITS_OF) touch: those of the others are made as
        if after it, where they do not interfere (Edits.interferes_with, can_come_after)."""
        waited = set(self._waited_for(transform_cls))
        return Edits.pending_of([t.edits for t in self.transforms if t.NAME in waited])

    def pending_for(self, transform_cls: type[Transform]) -> bool:
        """Does the transform's plan read edits (or imports) this stage has not made yet?"""
        return bool(self._waited_for(transform_cls))

    def _waited_for(self, transform_cls: type[Transform]) -> list[str]:
        """The NAMEs of the transforms of this stage whose pending edits (or imports) its plan reads."""
        seen = transform_cls.SEES_EDITS_OF
        return [t.NAME for t in self.transforms if (t.edits or t.report.imports) and (seen is None or t.NAME in seen)]


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

    def fit_to_width(self, tree: ast.Module) -> None:
        """Lay out again the statements whose lines the conversion made wider than the file's own
        (ddpify.codemods.width; `tree` is the code's); the last step: the CST module is not kept in step with the text."""
        limit = width_limit(self.output.source)
        self.code, self.origin = fit_to_width(self.module, self.code, self.origin, limit, tree)

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
