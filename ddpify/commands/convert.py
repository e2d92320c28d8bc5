"""`ddpify convert PATH... --to ddp|dp`: rewrite single-GPU training scripts (never runs them)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import click

from ddpify.codemods.pipeline import ConversionResult, Status
from ddpify.exit_codes import EXIT_ERROR, EXIT_FOUND, EXIT_INCOMPLETE, EXIT_OK
from ddpify.review import unified_diff
from ddpify.python_files import iter_python_files
from ddpify.sources import SourceError, check_syntax, mentions_torch, read_source, unchanged_since_read, write_atomic

LAUNCH = {
    "ddp": "torchrun --standalone --nproc_per_node=<GPUS> {path}",
    "dp": "python {path}",
    "fsdp": "torchrun --standalone --nproc_per_node=<GPUS> {path}",
    "accelerate": "accelerate launch --num_processes=<GPUS> {path}  (or torchrun --standalone --nproc_per_node=<GPUS> {path})",
}


_HELD = "nothing written (use --partial to write it anyway)"


@dataclass(frozen=True)
class Outcome:
    """How one file went: its conversion status (None: it failed) and whether it would change."""

    status: Status | None
    would_change: bool = False

    @property
    def failed(self) -> bool:
        return self.status is None

    @property
    def word(self) -> str:
        """The word the run's summary counts this file under."""
        if self.status is None:
            return "failed"
        return "unchanged" if self.status is Status.NOTHING_TO_DO else self.status.value


UNCHANGED = Outcome(Status.NOTHING_TO_DO)
FAILED = Outcome(None)
_CHANGED = Outcome(Status.CONVERTED, would_change=True)


def exit_code(outcomes: Sequence[Outcome], check: bool) -> int:
    """2 if a file failed, else 3 if a conversion is incomplete, else 1 if --check found work, else 0."""
    if any(o.failed for o in outcomes):
        return EXIT_ERROR
    if any(o.status is Status.INCOMPLETE for o in outcomes):
        return EXIT_INCOMPLETE
    return EXIT_FOUND if check and any(o.would_change for o in outcomes) else EXIT_OK


def summary_line(outcomes: Sequence[Outcome]) -> str:
    """`3 converted, 1 incomplete, 2 unchanged, 0 failed`."""
    words = [o.word for o in outcomes]
    return ", ".join(f"{words.count(w)} {w}" for w in ("converted", "incomplete", "unchanged", "failed"))


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, readable=False))
@click.option("--to", "target", type=click.Choice(["ddp", "dp", "fsdp", "accelerate"]), required=True,
              help="DistributedDataParallel (torchrun), nn.DataParallel, FSDP2 fully_shard (torchrun), or Hugging Face Accelerate.")
@click.option("-o", "--output", type=str, default=None, help="Write here instead of <name>_<to>.py ('-' for stdout). One input only.")
@click.option("--in-place", is_flag=True, help="Overwrite the input files (atomically).")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff; write nothing.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if any file would change (3 if a conversion is incomplete).")
@click.option("--partial", is_flag=True, help="Write incomplete conversions too (they still exit 3 and say what is missing).")
@click.option("--batch-size", type=click.Choice(["per-gpu", "global"]), default="per-gpu", show_default=True,
              help="per-gpu: every GPU keeps the script's batch size; global: it is divided by the world size.")
@click.option("--eval", "eval_mode", type=click.Choice(["shard", "whole"]), default="shard", show_default=True,
              help="shard: split evaluation loops whose sums are recognised across ranks and all_reduce them; whole: every rank evaluates the full set.")
@click.option("--log-loss", type=click.Choice(["reduced", "rank0"]), default="reduced", show_default=True,
              help="reduced: training-loss prints show the mean over ranks (one all_reduce per print); rank0: rank 0's own loss.")
@click.option("--checkpoint", type=click.Choice(["full", "sharded"]), default="full", show_default=True,
              help="--to fsdp: full: state dicts gathered whole on every rank, written by rank 0 (they load into the "
                   "single-GPU model); sharded: torch.distributed.checkpoint (DCP) on every rank, each writing its own "
                   "shards; the script's checkpoint path (ckpt.pt) becomes a directory of that name, read back with dcp.load.")
@click.option("--mixed-precision", type=click.Choice(["keep", "policy"]), default="keep", show_default=True,
              help="--to fsdp, where the script autocasts: keep: autocast as written (and advice); policy: also "
                   "fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=<autocast's dtype, bf16 unless fp16 "
                   "is asked for>, reduce_dtype=torch.float32)).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and warnings.")
@click.option("--format", "report_format", type=click.Choice(["text", "markdown"]), default="text", show_default=True,
              help="markdown: print a review-ready summary per file (changes grouped, warnings, diff) instead of the per-line report.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes converting files at once; reports and files come out as with one.")
def convert(paths, target, output, in_place, show_diff, check, partial, batch_size, eval_mode, log_loss, checkpoint,
            mixed_precision, quiet, report_format, jobs):
    """Convert single-GPU training scripts to DDP, DataParallel or FSDP2.

    Static: the scripts are parsed, never imported or executed (only `ddpify verify` runs code).
    Each file ends converted, nothing to do (said why), or incomplete: what is missing, with its
    line and what to do by hand; an incomplete conversion is written only with --partial.

    \b
    Exit codes (the first that applies):
      2  bad input (named with file and line; the other files are still processed)
      3  a conversion is incomplete (also with --partial, --diff or --check)
      1  --check found work
      0  converted, or nothing to do
    """
    if output is not None and not output.strip():
        raise click.UsageError("-o/--output needs a file name ('-' for stdout)")
    if sum(map(bool, (output, in_place, show_diff, check))) > 1:
        raise click.UsageError("choose at most one of -o, --in-place, --diff, --check")
    if target != "fsdp" and (checkpoint, mixed_precision) != ("full", "keep"):
        raise click.UsageError("--checkpoint and --mixed-precision apply to --to fsdp only")
    files = list(iter_python_files(paths, writing=in_place))
    if output and len(files) != 1:
        raise click.UsageError("-o/--output takes exactly one input file")
    mode = "check" if check else "diff" if show_diff else "in-place" if in_place else "write"
    options = {"batch_size": batch_size, "eval": eval_mode, "log_loss": log_loss, "checkpoint": checkpoint,
               "mixed_precision": mixed_precision}
    job = _Job(target, mode, output, options, quiet, report_format, partial)
    plan = _plan_projects(paths, files, target, options, mode, output, jobs)
    outcomes = [_convert_one(item, job.for_file(plan.output_for(item, output)), explicit=_named(item, paths), member=plan.job(item))
                for item in plan.items]
    outcomes += [_fail(error) for error in plan.copy_unchanged_modules(partial)] if mode == "write" else []
    outcomes += _finish_writes(plan, outcomes, job) if job.writes else []
    if len(outcomes) > 1:
        click.echo(summary_line(outcomes), err=job.to_stderr)
    sys.exit(exit_code(outcomes, check))


def _finish_writes(plan, outcomes: list[Outcome], job: "_Job") -> list[Outcome]:
    """Put each project's files in place together, or none of a project a file of which failed."""
    failed = [item for item, outcome in zip(plan.items, outcomes) if outcome.failed]
    errors, held = plan.finish_writes(failed)
    for path, cause in held:
        click.echo(f"{path}: held: {cause}, of the same project, failed; nothing written", err=job.to_stderr)
    return [_fail(error) for error in errors]


@dataclass(frozen=True)
class _Job:
    """What the user asked of every file in this run."""

    target: str
    mode: str  # write, in-place, diff or check
    output: str | None
    options: dict  # convert_source's keyword arguments (batch_size, eval, log_loss, checkpoint, mixed_precision)
    quiet: bool
    report_format: str
    partial: bool

    def for_file(self, output: str | None) -> "_Job":
        """The same run, writing one file to `output` (a project's mirror decides it per file)."""
        return replace(self, output=output)

    @property
    def to_stderr(self) -> bool:
        """Reports go to stderr when stdout carries a diff or the converted code."""
        return self.mode in ("check", "diff") or self.output == "-"

    @property
    def writes(self) -> bool:
        return self.mode in ("write", "in-place")


def _plan_projects(paths, files, target, options, mode, output, jobs):
    """Entry scripts and the local modules they import, converted together (see ddpify.project_conversion)."""
    from ddpify.project_conversion import LayoutError, plan_conversion

    try:
        return plan_conversion(paths, files, target, options, mode, output, jobs)
    except LayoutError as error:
        raise click.UsageError(str(error)) from None


def _named(item, paths) -> bool:
    return not isinstance(item, SourceError) and any(Path(p) == item for p in paths)


def _convert_one(item, job: _Job, explicit: bool, member=None) -> Outcome:
    """Convert one file, report it, and never let its failure stop the others.

    `member`: the file's conversion as part of its project (ddpify.project_conversion), already done."""
    if isinstance(item, SourceError):
        return _fail(item)
    if item.suffix == ".ipynb":
        return _convert_notebook(item, job)
    try:
        source = member.source if member else read_source(item)
        if not member and not mentions_torch(source.text):
            if explicit and not job.quiet:
                click.echo(f"{item}: does not use torch; left alone")
            return UNCHANGED
        if not member:  # a project's member was checked when the project read it (ddpify.project_conversion)
            check_syntax(source)
        from ddpify.convert import convert_source
        from ddpify.project_conversion import ensure_compiles

        if member:  # its output was compiled with the project's (ddpify.project_conversion)
            result = member.convert()
        else:
            result = convert_source(source.text, job.target, path=str(item), **job.options)
            ensure_compiles(item, result.output)
    except SourceError as error:
        return _fail(error)
    except Exception as error:  # a bug in ddpify: report it against the file, go on with the others
        return _fail(f"{item}: internal error while converting ({type(error).__name__}: {error}); please report it")
    if job.report_format == "markdown":
        from ddpify.review import markdown_summary

        click.echo(markdown_summary(item, result, job.target), err=job.output == "-")
    else:
        _report(item, result, job)
    return _settle(item, result, job, lambda: _preview(item, result, job) or _emit(item, source, result, job, member),
                   mirrored=bool(member and member.output), entry_incomplete=bool(member and member.entry_incomplete),
                   failed_member=member.failed_member if member else "")


def _settle(item, result: ConversionResult, job: _Job, emit: Callable[[], Outcome], mirrored: bool = False,
            entry_incomplete: bool = False, failed_member: str = "") -> Outcome:
    """Emit (write, print or diff) what may be emitted, and say so when the conversion is incomplete.

    An incomplete conversion is written only with --partial; --diff and --check show it as usual. So
    is a module imported by an entry whose conversion is incomplete (`entry_incomplete`): the project
    is written whole or not at all. No file of a project another file of which failed to convert
    (`failed_member`) is written, not even with --partial. An entry left unchanged inside a project
    mirror is still written there (`mirrored`).
    """
    status = result.status
    if status is Status.NOTHING_TO_DO and not (mirrored and job.mode == "write"):
        return UNCHANGED
    held = job.writes and (bool(failed_member) or (status is Status.INCOMPLETE or entry_incomplete) and not job.partial)
    outcome = Outcome(status, would_change=True) if held else emit()
    with_failure = f"held: {failed_member}, of the same project, failed to convert; nothing written"
    if status is Status.INCOMPLETE and not outcome.failed:
        done = f"; {with_failure}" if held and failed_member else f"; {_HELD}" if held else \
            "; written anyway (--partial): finish it by hand" if job.writes else ""
        click.echo(f"{item}: incomplete: {result.reason}{done}", err=job.to_stderr)
    elif held and failed_member:
        click.echo(f"{item}: {with_failure}", err=job.to_stderr)
    elif held:
        click.echo(f"{item}: held with its project's incomplete entry; nothing written (use --partial to write it anyway)", err=job.to_stderr)
    return outcome if outcome.failed else Outcome(status, would_change=True)


def _preview(item, result: ConversionResult, job: _Job) -> Outcome | None:
    """--check says what would change, --diff shows it; None in the modes that write."""
    if job.mode == "check":
        click.echo(f"would convert {item}")
    elif job.mode == "diff":
        if job.report_format != "markdown":  # the markdown summary holds the diff
            click.echo(unified_diff(item, result.source, result.output), nl=False)
    else:
        return None
    return _CHANGED


def _emit(item, source, result, job: _Job, member=None) -> Outcome:
    """Print the converted code, or write it: with its project where it is a member of one (written
    all or none, ddpify.project_conversion), else at once. An imported module is not launched."""
    if job.output == "-":
        click.echo(result.output, nl=False)
        return _CHANGED
    if job.mode == "in-place" and not unchanged_since_read(source):
        return _fail(f"{item}: changed on disk while being converted; not overwritten (run again)")
    destination = _destination(item, job)
    launch = LAUNCH[job.target].format(path=destination) if member is None or member.entry else ""
    if launch and job.target == "accelerate":
        from ddpify.codemods.accelerate.runtime import install_note

        launch += install_note()
    return _write(destination, lambda: source.encode(result.output), source.mode, job.quiet, launch, member and member.writes)


def _destination(item: Path, job: _Job) -> Path:
    return Path(job.output) if job.output else item if job.mode == "in-place" else _default_output(item, job.target)


def _write(destination: Path, data, file_mode, quiet, launch: str, project=None) -> Outcome:
    """Write atomically (`data()` builds the bytes and may refuse), then say where and how to run it;
    with the rest of `project` (its ProjectWrites) where one is given: said once they are all written."""
    written = partial(_say_written, destination, quiet, launch)
    try:
        if project is not None:
            project.write(destination, data(), file_mode, written)
            return _CHANGED
        os.makedirs(destination.parent, exist_ok=True)
        write_atomic(destination, data(), file_mode)
    except SourceError as error:
        return _fail(error)
    written()
    return _CHANGED


def _say_written(destination: Path, quiet: bool, launch: str) -> None:
    if not quiet:
        click.echo(f"wrote {destination}")
        if launch:
            click.echo(f"launch: {launch}")


def _convert_notebook(item, job: _Job) -> Outcome:
    """--to dp: a converted notebook (DataParallel runs in a kernel); --to ddp: a torchrun script."""
    from ddpify.convert import convert_notebook
    from ddpify.notebooks import lint_location
    from ddpify.project_conversion import ensure_compiles

    try:
        new_nb, result, cell_map = convert_notebook(item, job.target, **job.options)
        ensure_compiles(item, result.output)
    except SourceError as error:
        return _fail(error)
    except Exception as error:  # unreadable notebook, lost cell markers, or a bug in ddpify
        return _fail(f"{item}: cannot convert this notebook ({type(error).__name__}: {error})")
    locate = lambda line: lint_location(cell_map, line)  # noqa: E731
    if job.report_format == "markdown":
        from ddpify.review import markdown_summary

        click.echo(markdown_summary(item, result, job.target, locate=locate, warnings=cell_map.warnings), err=job.output == "-")
    else:
        for warning in cell_map.warnings:
            click.echo(f"{item}:{warning}", err=job.to_stderr)
        _report(item, result, job, locate=locate)
    return _settle(item, result, job, lambda: _preview(item, result, job) or _emit_notebook(item, new_nb, result, job))


def _emit_notebook(item, new_nb, result, job: _Job) -> Outcome:
    import nbformat

    if job.target in ("ddp", "fsdp"):  # a torchrun job cannot run inside a kernel: write a script for torchrun
        if job.mode == "in-place":
            return _fail(f"{item}: --to ddp makes a script for torchrun, not a notebook; use -o or the default output")
        text = result.output
        if job.output == "-":
            click.echo(text, nl=False)
            return _CHANGED
        destination = Path(job.output) if job.output else item.with_name(f"{item.stem}_{job.target}.py")
        return _write(destination, lambda: text.encode("utf-8"), None, job.quiet, LAUNCH[job.target].format(path=destination))
    if job.output == "-":
        click.echo(nbformat.writes(new_nb) + "\n", nl=False)
        return _CHANGED
    return _write(_destination(item, job), lambda: _notebook_bytes(nbformat, new_nb), None, job.quiet, "run the notebook as before")


def _notebook_bytes(nbformat, notebook) -> bytes:
    """The notebook's JSON, refusing to write one that does not validate."""
    try:
        nbformat.validate(notebook)
    except nbformat.ValidationError as error:
        raise SourceError("<notebook>", f"converted notebook does not validate ({error.message}); nothing written") from None
    return (nbformat.writes(notebook) + "\n").encode("utf-8")


def _report(item, result: ConversionResult, job: _Job, locate=str) -> None:
    """One line per change, warning and missing item, located in the original file (`locate` maps a line);
    a file with nothing to do says why."""
    err = job.to_stderr
    if result.status is Status.NOTHING_TO_DO and not job.quiet:
        click.echo(f"{item}: {result.note or 'no changes needed; nothing written'}", err=err)
    for change in [] if job.quiet else result.changes:
        click.echo(f"{item}:{locate(change.line)}: [{change.transform}] {change.message}", err=err)
    for advice in result.advice:
        click.echo(f"{item}:{locate(advice.line)}: warning: {advice.message}", err=err)
    for missing in result.missing:
        click.echo(f"{item}:{locate(missing.line)}: missing: {missing.what}; {missing.todo}", err=err)


def _default_output(path: Path, target: str) -> Path:
    return path.with_name(f"{path.stem}_{target}{path.suffix}")


def _fail(error) -> Outcome:
    click.echo(f"error: {error}", err=True)
    return FAILED


COMMANDS = (convert,)
