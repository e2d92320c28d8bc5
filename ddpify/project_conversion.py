"""Convert projects, not files: an entry script and the local modules it imports, each written where imports work.

`ddpify convert train.py` treats train.py as an entry point and follows its local imports
(ddpify.anatomy.project); a directory is searched for entry points (a `__main__` block, or training
at module level), and its other modules are converted only as part of the projects that import them.
Only entry scripts join the process group; an imported module gets just the edits it needs.

Where the converted files go (write mode):
- When only the entry script changes, as for a lone script: `<name>_<to>.py` beside it (or `-o FILE`).
- When imported modules change too, the whole project is mirrored into `<project dir>_<to>/` beside
  the project directory (or `-o DIR`): converted files replace their originals there, every other
  Python file of the project is copied unchanged, so the converted entry imports converted modules.
  The user's files are never touched; the launch line names the mirrored entry script.
`--in-place`, `--diff` and `--check` handle every changed file of the project where it is.

A project is written all or nothing (ProjectWrites): each file goes to a temp file beside its
destination, and they are renamed into place together once every one is written; where a write
fails, the temps and the directories made for them are removed, and every file is left as it was.
"""

from __future__ import annotations

import ast
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

from ddpify.anatomy import Anatomy, analyze
from ddpify.anatomy.project import ModuleFile, Project, import_roots, is_entry_point, within
from ddpify.codemods.accelerate.handover import hand_over_accelerator
from ddpify.codemods.pipeline import ConversionResult, Status
from ddpify.codemods.report import Missing
from ddpify.convert import ALREADY_DISTRIBUTED, NO_TRAINING
from ddpify.python_files import iter_python_files
from ddpify.sources import Source, SourceError, check_syntax, mentions_torch, put_in_place, read_source, write_beside


class ProjectWrites:
    """One project's files, written all or none: staged in temp files beside their destinations
    (`write`, write_atomic's signature), then renamed into place together (`finish`)."""

    def __init__(self) -> None:
        self.staged: list[tuple[str, Path, Callable[[], None]]] = []  # (temp file, destination, what to say once written)
        self.made: list[Path] = []  # the directories made for them, outermost first
        self.failed = ""  # the file whose write failed

    def write(self, path: Path, data: bytes, mode: int | None = None, written: Callable[[], None] = lambda: None) -> None:
        """Stage `data` for `path`; `written` runs once it is in place. A failure fails the project."""
        try:
            self._make_directories(Path(path).parent)
            self.staged.append((write_beside(path, data, mode), Path(path), written))
        except (SourceError, OSError) as error:
            self.failed = str(path)
            raise error if isinstance(error, SourceError) else SourceError(path, f"cannot write: {error}") from None

    def _make_directories(self, directory: Path) -> None:
        missing = [d for d in (directory, *directory.parents) if not d.exists()]
        os.makedirs(directory, exist_ok=True)
        self.made += reversed(missing)

    def finish(self) -> list[SourceError]:
        """Put every staged file in place (saying so): the errors of renames that failed."""
        errors = []
        for temp, path, written in self.staged:
            try:
                put_in_place(temp, path)
                written()
            except SourceError as error:
                errors.append(error)
        self.staged, self.made = [], []
        return errors

    def discard(self) -> list[Path]:
        """Remove the staged files and the directories made for them: the destinations not written."""
        held = [path for _, path, _ in self.staged]
        for temp, _, _ in self.staged:
            os.unlink(temp)
        for directory in reversed(self.made):
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        self.staged, self.made = [], []
        return held


class LayoutError(Exception):
    """The requested output can't hold a project conversion (e.g. several files to stdout)."""


@dataclass
class FileJob:
    """One file of a project: its source, its conversion (or the error it raised), where it goes."""

    path: Path
    source: Source
    entry: bool
    result: ConversionResult | None = None
    error: Exception | None = None
    output: str | None = None  # write mode: the mirrored path; None: the command's own choice
    entry_incomplete: bool = False  # an imported module whose entry's conversion is incomplete: held with it
    failed_member: str = ""  # another file of the project that failed to convert: this one is held with it
    writes: ProjectWrites | None = None  # its project's, where the modules change too: written with them

    def convert(self) -> ConversionResult:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]

    @property
    def changed(self) -> bool:
        return self.result is not None and self.result.changed


@dataclass
class ProjectConversion:
    """The converted files of one project and, when its imported modules change, the mirror directory."""

    project: Project
    jobs: list[FileJob]
    mirror: Path | None = None
    writes: ProjectWrites = field(default_factory=ProjectWrites)

    @property
    def modules_changed(self) -> bool:
        """Do modules the entry scripts import need edits too (so the entries need the converted copies)?"""
        return any(job.changed for job in self.jobs if not job.entry)

    def job(self, path: Path) -> FileJob | None:
        return next((job for job in self.jobs if job.path == path), None)

    @property
    def entry_incomplete(self) -> bool:
        return any(job.entry and (job.error is not None or job.result.status is Status.INCOMPLETE) for job in self.jobs)  # type: ignore[union-attr]

    @property
    def failed_member(self) -> str:
        """The first file of the project whose conversion raised ('' if none): then no file of it is written."""
        return next((str(job.path) for job in self.jobs if job.error is not None), "")


@dataclass
class ConversionPlan:
    """What one `convert` run does: `items` in order, each a path (maybe with a job) or an error to report."""

    items: list[Path | SourceError] = field(default_factory=list)
    jobs: dict[Path, FileJob] = field(default_factory=dict)
    projects: list[ProjectConversion] = field(default_factory=list)

    def job(self, item) -> FileJob | None:
        return self.jobs.get(item) if isinstance(item, Path) else None

    def output_for(self, item, output: str | None) -> str | None:
        job = self.job(item)
        return job.output if job is not None and job.output else output

    def copy_unchanged_modules(self, partial: bool = False) -> list[SourceError]:
        """Write mode: complete each mirror with the project's Python files that needed no change (not
        the mirror of an incomplete project, unless `partial`, nor ever that of a project a file of which failed)."""
        errors: list[SourceError] = []
        for conversion in self.projects:
            if conversion.mirror is not None and not conversion.failed_member and (partial or not conversion.entry_incomplete):
                errors += _complete_mirror(conversion)
        return errors

    def finish_writes(self, failed: Iterable[Path]) -> tuple[list[SourceError], list[tuple[Path, str]]]:
        """Write mode and --in-place: put each project's staged files in place, or none of them where a
        file of it failed (one of the items `failed`, or a staged write). The errors of renames that
        failed, and (file, the file that failed) for each file held."""
        failed = set(failed)
        errors: list[SourceError] = []
        held: list[tuple[Path, str]] = []
        for conversion in self.projects:
            cause = conversion.writes.failed or next((str(job.path) for job in conversion.jobs if job.path in failed), "")
            if cause:
                held += [(path, cause) for path in conversion.writes.discard()]
            else:
                errors += conversion.writes.finish()
        return errors, held


def plan_conversion(paths: Iterable, files: list, target: str, options: dict, mode: str, output: str | None,
                    jobs: int = 1) -> ConversionPlan:
    """Find the projects among `files` (named files are entry points; walked ones are searched) and convert
    them, in `jobs` worker processes."""
    named = {Path(p) for p in paths}
    plan = ConversionPlan()
    entries: dict[Path, list[Path]] = {}  # by the directory their imports resolve from
    for item in files:
        kind = "other" if isinstance(item, SourceError) or item.suffix != ".py" else _script_kind(item, item in named)
        if kind != "library":  # walked modules are converted only with the entry scripts that import them
            plan.items.append(item)
        if kind == "entry":
            entries.setdefault(import_roots(item)[0], []).append(item)
    sources: dict[Path, Source] = {}
    projects = []
    for group in entries.values():
        project = Project(group, lambda path: _read(path, sources))
        project.entries = [e for e in group if e in named or not _imported_by_another(project, e)] or group
        projects.append(project)
    for group, conversion in zip(entries.values(), _convert_projects(projects, sources, target, options, jobs)):
        _lay_out(conversion, target, mode, output)
        _add_project(plan, conversion, group)
    return plan


def _add_project(plan: ConversionPlan, conversion: ProjectConversion, group: list[Path]) -> None:
    """The project's jobs; its changed (or failing) modules listed after its last entry script, demoted
    entries (imported by another entry) among them, and the modules it could not read as errors."""
    plan.projects.append(conversion)
    plan.jobs.update((job.path, job) for job in conversion.jobs)
    project = conversion.project
    demoted = set(group) - set(project.entries)
    plan.items = [i for i in plan.items if not (isinstance(i, Path) and i in demoted)]
    at = plan.items.index(project.entries[-1]) + 1
    plan.items[at:at] = [job.path for job in conversion.jobs if not job.entry and (job.changed or job.error)]
    plan.items += [error if isinstance(error, SourceError) else SourceError(path, str(error))
                   for path, error in project.unreadable.items() if path not in group]


def _script_kind(path: Path, named: bool) -> str:
    """'entry' for a script to convert (a named file, or a walked one with a __main__ block or top-level
    training), 'library' for other walked modules, 'other' for what the command handles alone."""
    try:
        source = read_source(path)
        if not mentions_torch(source.text):
            return "other" if named else "library"
        return "entry" if named or is_entry_point(analyze(source.text, str(path))) else "library"
    except (SourceError, SyntaxError, ValueError):
        return "other"  # the command reports it


def _read(path: Path, sources: dict[Path, Source]) -> str:
    """The file's text, read and syntax-checked once however often the project asks for it."""
    if path not in sources:
        source = read_source(path)
        check_syntax(source)
        sources[path] = source
    return sources[path].text


def _imported_by_another(project: Project, entry: Path) -> bool:
    """A module other entry points import is their library, even with a `__main__` block of its own."""
    return any(entry in project.imports_of(m) for m in project.files() if m.path != entry and m.path in project.entries)


def convert_entry(entry: Path, target: str, options: dict) -> ProjectConversion:
    """Convert one entry script and the project modules it imports (what `ddpify verify` runs)."""
    sources: dict[Path, Source] = {}
    return _convert_projects([Project([entry], lambda path: _read(path, sources))], sources, target, options)[0]


def write_mirror(conversion: ProjectConversion, mirror: Path) -> Path:
    """Write the converted project into `mirror` (changed files converted, the others copied); return the entry's path there."""
    conversion.mirror = mirror
    root, writes = conversion.project.root, conversion.writes
    try:
        for job in conversion.jobs:
            if job.changed or job.entry:
                writes.write(mirror / within(job.path, root), job.source.encode(job.result.output))  # type: ignore[union-attr]
        errors = _complete_mirror(conversion)
        if errors:
            raise errors[0]
    except SourceError:
        writes.discard()
        raise
    errors = writes.finish()
    if errors:
        raise errors[0]
    return mirror / within(conversion.project.entries[0], root)


def _convert_projects(projects: list[Project], sources: dict[Path, Source], target: str, options: dict,
                      jobs: int = 1) -> list[ProjectConversion]:
    """Convert every module of the projects, in `jobs` worker processes; `options` are convert_source's
    (batch_size, eval, log_loss, checkpoint, mixed_precision)."""
    modules = [(project, module) for project in projects for module in project.files()]
    in_process = jobs == 1 or len(modules) < 2
    work = [(module.text, str(module.path), module.facts, not project.is_entry(module), _analysis(module) if in_process else None)
            for project, module in modules]
    convert = partial(_convert_module, target=target, options=options)
    if in_process:
        outcomes = list(map(convert, work))
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
            outcomes = list(pool.map(convert, work))
    conversions = {id(project): ProjectConversion(project, []) for project in projects}
    for (project, module), (result, error) in zip(modules, outcomes):
        job = FileJob(module.path, sources[module.path], entry=project.is_entry(module), result=result, error=error)
        if job.entry and result is not None:
            _training_out_of_sight(result, project.unresolved.get(module.path, []))
        conversions[id(project)].jobs.append(job)
    for conversion in conversions.values():
        if target == "accelerate":
            hand_over_accelerator(conversion.jobs)
        distributed = _entries_already_distributed(conversion)
        for job in conversion.jobs:
            job.entry_incomplete = not job.entry and conversion.entry_incomplete
            job.failed_member = conversion.failed_member if job.error is None else ""
            job.writes = conversion.writes if conversion.modules_changed else None  # entries alone: each written at once
            if distributed and not job.entry and job.result is not None:
                job.result = ConversionResult(job.result.source, job.result.source, note=f"imported by {distributed}, already distributed")
    return list(conversions.values())


def _analysis(module: ModuleFile) -> Anatomy | None:
    """The module's analysis from the project's last round, for its conversion to start from; None
    where the project handed the module facts that analysis has not seen (its last round ran out).
    A worker process analyses its modules again: an analysis does not cross processes cheaply."""
    return module.anatomy if module.anatomy is not None and module.anatomy.facts is module.facts else None


def _entries_already_distributed(conversion: ProjectConversion) -> str:
    """The entry scripts' names when every one is already distributed: their modules are theirs as they are
    (an imported model.py is not given rank-0 guards behind an entry that already handles its ranks)."""
    entries = [job for job in conversion.jobs if job.entry]
    if entries and all(job.result is not None and job.result.note.startswith(ALREADY_DISTRIBUTED) for job in entries):
        return ", ".join(job.path.name for job in entries)
    return ""


def _training_out_of_sight(result: ConversionResult, unresolved: list) -> None:
    """An entry with no training in sight whose imports ddpify could not follow is incomplete, not
    "nothing to do": its training may live in a module it imports."""
    if result.status is not Status.NOTHING_TO_DO or not result.note.startswith(NO_TRAINING) or not unresolved:
        return
    for node in unresolved:
        module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        result.missing.append(Missing(node.lineno, f"no training found here; it may live in {module}, which ddpify found neither in the project nor installed",
                                      "make it importable (run from the repository root, add its directory to PYTHONPATH, or pip install -e the "
                                      "repository) and convert again"))


def _convert_module(work: tuple, target: str, options: dict) -> tuple[ConversionResult | None, Exception | None]:
    """One module's conversion, or the error it raised (reported against that file by the command)."""
    from ddpify.convert import convert_source

    text, path, facts, library, anatomy = work
    try:
        result = convert_source(text, target, path=path, **options, facts=facts, library=library, anatomy=anatomy)
        ensure_compiles(path, result.output)  # before any file of the project is written
        return result, None
    except Exception as error:  # the others go on
        return None, error


def ensure_compiles(path, text: str) -> None:
    """Raise a SourceError at the line where a converted `text` is not valid Python."""
    try:
        compile(text, str(path), "exec", dont_inherit=True)
    except SyntaxError as error:
        raise SourceError(str(path), f"conversion produced invalid code ({error.msg}); nothing written, please report it", line=error.lineno) from None


def _lay_out(conversion: ProjectConversion, target: str, mode: str, output: str | None) -> None:
    """Keep the one-file layout when only entry scripts change; mirror the project when modules change too."""
    if not conversion.modules_changed or mode != "write":
        return
    if output == "-":
        raise LayoutError("the conversion changes several files of the project; write them with -o DIR, not to stdout")
    root = conversion.project.root
    mirror = Path(output) if output else Path(os.path.normpath(root / os.pardir / f"{root.resolve().name}_{target}"))
    if mirror.resolve() == root.resolve():
        raise LayoutError(f"{mirror}: is the project itself; use --in-place to edit its files")
    if mirror.exists() and not mirror.is_dir():
        raise LayoutError(f"{mirror}: the conversion changes several files of the project; -o must name a directory")
    conversion.mirror = mirror
    for job in conversion.jobs:
        job.output = str(mirror / within(job.path, root))  # its directories are made when it is written


def _complete_mirror(conversion: ProjectConversion) -> list[SourceError]:
    """Copy the project's other Python files into the mirror, byte for byte, so its imports resolve."""
    root, mirror = conversion.project.root, conversion.mirror
    written = {job.path.resolve() for job in conversion.jobs if job.changed or job.entry}
    errors = []
    for item in iter_python_files([root]):
        if isinstance(item, SourceError) or item.suffix != ".py" or item.resolve() in written or _inside(item, mirror):  # type: ignore[arg-type]
            continue
        destination = mirror / within(item, root)  # type: ignore[arg-type]
        try:
            conversion.writes.write(destination, item.read_bytes())  # type: ignore[union-attr]
        except (SourceError, OSError) as error:
            conversion.writes.failed = conversion.writes.failed or str(item)
            errors.append(error if isinstance(error, SourceError) else SourceError(destination, str(error)))
    return errors


def _inside(path: Path, directory: Path | None) -> bool:
    return directory is not None and directory.resolve() in path.resolve().parents
