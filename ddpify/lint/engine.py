"""Run the enabled rules over files: parse once, one pass of every rule that applies to the
script's kind, drop suppressed findings, and optionally apply fixes (iterating until none is left)."""

from __future__ import annotations

import ast
import difflib
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from typing import Callable, Iterable, Sequence

from ddpify.anatomy import Anatomy, Pos, ScriptKind, analyze
from ddpify.lint.config import Config
from ddpify.lint.fixes import apply_fixes
from ddpify.lint.registry import all_rules
from ddpify.lint.rule import Finding, Fix, Rule
from ddpify.lint.suppress import Directive, add_directives, by_line, directive_comments, statement_last_lines, suppressing_line, unused_directives
from ddpify.python_files import iter_python_files
from ddpify.sources import Source, SourceError, check_syntax, mentions_torch, read_source, unchanged_since_read, write_atomic

MAX_FIX_ROUNDS = 10
MIN_FILES_FOR_POOL = 8
NOTEBOOK_SUFFIX = ".ipynb"
NOTEBOOK_FIX_NOTE = "{path}: fixes are not supported for notebooks yet; findings reported, notebook left unchanged"


@dataclass(frozen=True)
class Diagnostic:
    """One finding of one rule in one file, ready to print."""

    path: str
    code: str
    name: str
    message: str
    severity: str
    pos: Pos
    fix: Fix | None
    source_line: str
    # Notebooks only: `pos` is a line of the joined script (ddpify.notebooks.notebook_to_script);
    # `location` is where a reader finds it ("cell 4:line 2"), `cell` the 1-based cell number and
    # `cell_line` the 1-based line within that cell.
    location: str | None = None
    cell: int | None = None
    cell_line: int | None = None

    @property
    def sort_key(self) -> tuple:
        return (self.path, self.pos.line, self.pos.col, self.code)


@dataclass
class FileReport:
    """What linting one file gave: findings left, errors, fixes applied, and the fix diff."""

    path: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    fixes_applied: int = 0
    diff: str = ""
    skipped: bool = False  # never mentions torch: not parsed
    directives_added: int = 0  # --add-noqa
    notes: list[str] = field(default_factory=list)  # one-line remarks for stderr (not errors)


@dataclass(frozen=True)
class Options:
    """How to lint: the config, and whether to fix (write), show the fix diff, include unsafe fixes."""

    config: Config = field(default_factory=Config)
    fix: bool = False
    diff: bool = False
    unsafe_fixes: bool = False
    add_noqa: bool = False  # add suppression comments instead of fixing

    def wants(self, fix: Fix | None) -> bool:
        return fix is not None and (fix.safe or self.unsafe_fixes)


class FixError(Exception):
    """Applying fixes failed or produced code that does not parse."""


# ----- one text ---------------------------------------------------------------------------------
class RuleSet:
    """Instances of the enabled rules, grouped by the script kinds they apply to."""

    def __init__(self, rules: Iterable[type[Rule]]) -> None:
        self.rules = [rule() for rule in rules]
        self.by_kind = {kind: [r for r in self.rules if kind in r.applies_to] for kind in ScriptKind}


@lru_cache(maxsize=64)
def rule_set(codes: frozenset[str]) -> RuleSet:
    """The (cached) RuleSet of the rules with these codes."""
    return RuleSet(r for r in all_rules() if r.code in codes)


def parse(text: str, path: str, tree: ast.Module | None = None) -> Anatomy:
    """The anatomy of `text` (`tree`: its parse, where the caller has it); SourceError (`path:line:
    message`) when it is not valid Python."""
    try:
        return analyze(text, path, tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        check_syntax(Source(path=path, text=text, encoding="utf-8", bom=False, mode=None))
        raise SourceError(path, f"cannot be analysed: {type(e).__name__}: {e}") from None


def check_text(text: str, path: str, rules: RuleSet, tree: ast.Module | None = None) -> tuple[list[Diagnostic], list[str]]:
    """Findings of the rules on `text` (`tree`: its parse, where the caller has it; suppressed ones
    dropped), and errors of rules that crashed."""
    anatomy = parse(text, path, tree)
    found: list[Diagnostic] = []
    errors: list[str] = []
    for rule in rules.by_kind[anatomy.kind]:
        try:
            found.extend(_diagnostic(anatomy, rule, f) for f in rule.check(anatomy))
        except Exception as e:  # a broken rule must not stop the others or the other files
            errors.append(f"{path}: internal error in rule {rule.code}: {type(e).__name__}: {e}")
    judges = [r for r in rules.by_kind[anatomy.kind] if hasattr(r, "check_directives")]
    comments = directive_comments(text) if found or judges else []
    if comments:
        found, used = _unsuppressed(anatomy, found, comments)
        idle = unused_directives(comments, used)
        for rule in judges:
            found.extend(_diagnostic(anatomy, rule, f) for f in rule.check_directives(anatomy, idle))  # type: ignore[attr-defined]
    return sorted(found, key=lambda d: d.sort_key), errors


def _unsuppressed(anatomy: Anatomy, found: list[Diagnostic], comments: list[Directive]) -> tuple[list[Diagnostic], dict[int, set[str]]]:
    """The findings no directive suppresses, and for each directive's line the codes it suppressed."""
    lines = by_line(comments)
    last_lines = statement_last_lines(anatomy.tree)
    kept: list[Diagnostic] = []
    used: dict[int, set[str]] = {}
    for d in found:
        line = suppressing_line(d.code, d.pos, lines, last_lines)
        if line is None:
            kept.append(d)
        else:
            used.setdefault(line, set()).add(d.code)
    return kept, used


def _diagnostic(anatomy: Anatomy, rule: Rule, finding: Finding) -> Diagnostic:
    lines = anatomy.lines
    line = lines[finding.pos.line - 1] if 0 < finding.pos.line <= len(lines) else ""
    return Diagnostic(
        path=anatomy.path,
        code=rule.code,
        name=rule.name,
        message=finding.message or rule.message,
        severity=rule.severity,
        pos=finding.pos,
        fix=finding.fix,
        source_line=line,
    )


def fix_text(text: str, path: str, rules: RuleSet, options: Options) -> tuple[str, int, list[Diagnostic], list[str]]:
    """Apply the wanted fixes, re-linting after each round, until none is left (or MAX_FIX_ROUNDS).

    Returns the fixed text, the number of fixes applied, the findings left and rule errors.
    Raises FixError when the fixes break the code (the caller then leaves the file alone).
    """
    diagnostics, errors = check_text(text, path, rules)
    applied = 0
    for _ in range(MAX_FIX_ROUNDS):
        fixes = [d.fix for d in diagnostics if options.wants(d.fix)]
        if not fixes:
            break
        new_text, count = _apply(text, fixes, diagnostics)
        if new_text == text:
            break
        try:
            diagnostics, errors = check_text(new_text, path, rules)
        except SourceError as e:
            codes = ", ".join(sorted({d.code for d in diagnostics if options.wants(d.fix)}))
            raise FixError(f"{e} (after applying fixes of {codes}; file left unchanged)") from None
        text, applied = new_text, applied + count
    return text, applied, diagnostics, errors


def _apply(text: str, fixes: list[Fix], diagnostics: list[Diagnostic]) -> tuple[str, int]:
    try:
        return apply_fixes(text, fixes)
    except ValueError as e:
        codes = ", ".join(sorted({d.code for d in diagnostics if d.fix in fixes}))
        raise FixError(f"{diagnostics[0].path}: a fix of {codes} is malformed: {e}") from None


# ----- one file ---------------------------------------------------------------------------------
def lint_text(text: str, path: str, options: Options) -> tuple[FileReport, str]:
    """Lint (and, per options, fix) a text that is no file on disk, such as stdin read as `path`:
    the report and the text after fixes."""
    report = FileReport(path)
    if not mentions_torch(text):
        report.skipped = True
        return report, text
    try:
        rules = rule_set(options.config.enabled(all_rules(), path))
        if not (options.fix or options.diff):
            report.diagnostics, report.errors = check_text(text, path, rules)
            return report, text
        fixed, report.fixes_applied, report.diagnostics, report.errors = fix_text(text, path, rules, options)
        report.diff = unified_diff(path, text, fixed) if options.diff and fixed != text else ""
        return report, fixed
    except (SourceError, FixError) as e:
        report.errors.append(str(e))
    except Exception as e:  # a bug in the analysis: reported like any other file's
        report.errors.append(f"{path}: internal error: {type(e).__name__}: {e}")
    return report, text


def lint_file(path: str, options: Options) -> FileReport:
    """Read, lint and (per options) fix one file; problems become `report.errors`, never exceptions."""
    report = FileReport(path)
    if path.endswith(NOTEBOOK_SUFFIX):
        return _lint_notebook(path, options, report)
    try:
        source = read_source(path)
        if not mentions_torch(source.text):
            report.skipped = True
            return report
        rules = rule_set(options.config.enabled(all_rules(), path))
        if options.add_noqa:
            _add_noqa(source, rules, report)
        elif options.fix or options.diff:
            _fix_file(source, rules, options, report)
        else:
            report.diagnostics, report.errors = check_text(source.text, path, rules)
    except (SourceError, FixError) as e:
        report.errors.append(str(e))
    except Exception as e:  # a bug in the analysis must not stop the other files
        report.errors.append(f"{path}: internal error: {type(e).__name__}: {e}")
    return report


def _lint_notebook(path: str, options: Options, report: FileReport) -> FileReport:
    """Lint a notebook's joined code cells; findings are located by cell. Never writes (no fixes yet)."""
    from ddpify.notebooks import lint_location, read_notebook_script

    try:
        text, cell_map = read_notebook_script(path)
        if not mentions_torch(text):
            report.skipped = True
            return report
        if options.fix or options.diff or options.add_noqa:
            report.notes.append(NOTEBOOK_FIX_NOTE.format(path=path))
        rules = rule_set(options.config.enabled(all_rules(), path))
        diagnostics, report.errors = check_text(text, path, rules)
        report.diagnostics = [_in_cell(d, cell_map, lint_location) for d in diagnostics]
    except SourceError as e:
        report.errors.append(str(e))
    except Exception as e:  # a bug in the analysis must not stop the other files
        report.errors.append(f"{path}: internal error: {type(e).__name__}: {e}")
    return report


def _in_cell(d: Diagnostic, cell_map, lint_location) -> Diagnostic:
    """`d` with its notebook location (the cell and the line in it) filled in."""
    cell, line = cell_map.get(d.pos.line, (None, None))
    return replace(d, location=lint_location(cell_map, d.pos.line), cell=None if cell is None else cell + 1, cell_line=line)


def _fix_file(source: Source, rules: RuleSet, options: Options, report: FileReport) -> None:
    new_text, applied, report.diagnostics, report.errors = fix_text(source.text, source.path, rules, options)
    if new_text == source.text:
        return
    if options.diff:
        report.diff = unified_diff(source.path, source.text, new_text)
        report.fixes_applied = applied
        return
    _write_back(source, new_text)
    report.fixes_applied = applied


def _add_noqa(source: Source, rules: RuleSet, report: FileReport) -> None:
    """Add a `# ddpify: ignore[CODE]` comment for each current finding; keep those none could reach."""
    diagnostics, report.errors = check_text(source.text, source.path, rules)
    tree = parse(source.text, source.path).tree
    new_text, report.directives_added = add_directives(source.text, tree, ((d.code, d.pos) for d in diagnostics))
    if new_text != source.text:
        _write_back(source, new_text)
    report.diagnostics = check_text(new_text, source.path, rules)[0]


def _write_back(source: Source, new_text: str) -> None:
    """Write the edited file atomically, unless it changed on disk since it was read."""
    if not unchanged_since_read(source):
        raise SourceError(source.path, "changed on disk while being fixed; not written")
    write_atomic(source.path, source.encode(new_text), source.mode)


def unified_diff(path: str, old: str, new: str) -> str:
    """The `diff -u` of a fix, with git's a/ and b/ prefixes on relative paths."""
    before, after = (path, path) if os.path.isabs(path) else (f"a/{path}", f"b/{path}")
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), before, after)
    return "".join(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n" for line in lines)


# ----- many files -------------------------------------------------------------------------------
def collect_files(paths: Sequence[str], config: Config, writing: bool = False) -> tuple[list[str], list[str]]:
    """Python files and notebooks named by or found under `paths`, and errors finding them
    (`writing`: links leading outside a walked directory are skipped, see iter_python_files)."""
    files, errors = [], []
    for found in iter_python_files(paths, exclude=config.exclude, writing=writing):
        if isinstance(found, SourceError):
            errors.append(str(found))
        else:
            files.append(str(found))
    return files, errors


def lint_files(files: Sequence[str], options: Options, jobs: int | None = None,
               progress: Callable[[FileReport], None] | None = None) -> list[FileReport]:
    """Lint every file, in a process pool when there are enough of them; reports sorted by path.

    `progress`, when given, is called with each report as it is done (in the calling process).
    """
    jobs = jobs or os.cpu_count() or 1
    work = partial(lint_file, options=options)
    done = progress or (lambda report: None)
    reports = []
    if jobs == 1 or len(files) < MIN_FILES_FOR_POOL:
        for report in map(work, files):
            reports.append(report)
            done(report)
    else:
        all_rules()  # import the rules once, before the workers fork
        chunk = max(1, min(64, len(files) // (jobs * 4)))
        with ProcessPoolExecutor(max_workers=min(jobs, len(files))) as pool:
            for report in pool.map(work, files, chunksize=chunk):
                reports.append(report)
                done(report)
    return sorted(reports, key=lambda r: r.path)
