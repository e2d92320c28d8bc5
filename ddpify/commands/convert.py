"""`ddpify convert PATH... --to ddp|dp`: rewrite single-GPU training scripts (never runs them)."""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ddpify.commands import EXIT_ERROR, EXIT_FOUND, EXIT_OK
from ddpify.sources import (
    SourceError,
    check_syntax,
    iter_python_files,
    mentions_torch,
    read_source,
    unchanged_since_read,
    write_atomic,
)

LAUNCH = {
    "ddp": "torchrun --standalone --nproc_per_node=<GPUS> {path}",
    "dp": "python {path}",
}


@dataclass
class Outcome:
    """How one file went: whether it needs changes, and whether it failed."""

    would_change: bool = False
    failed: bool = False


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--to", "target", type=click.Choice(["ddp", "dp"]), required=True, help="DistributedDataParallel (torchrun) or nn.DataParallel.")
@click.option("-o", "--output", type=str, default=None, help="Write here instead of <name>_<to>.py ('-' for stdout). One input only.")
@click.option("--in-place", is_flag=True, help="Overwrite the input files (atomically).")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff; write nothing.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if any file would change.")
@click.option("--batch-size", type=click.Choice(["per-gpu", "global"]), default="per-gpu", show_default=True,
              help="per-gpu: every GPU keeps the script's batch size; global: it is divided by the world size.")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and warnings.")
@click.option("--format", "report_format", type=click.Choice(["text", "markdown"]), default="text", show_default=True,
              help="markdown: print a review-ready summary per file (changes grouped, warnings, diff) instead of the per-line report.")
def convert(paths, target, output, in_place, show_diff, check, batch_size, quiet, report_format):
    """Convert single-GPU training scripts to DDP or DataParallel.

    Static: the scripts are parsed, never imported or executed (only `ddpify verify` runs code).
    Exit codes: 0 done or nothing to do, 1 --check found work, 2 bad input (the rest still processed).
    """
    if sum(map(bool, (output, in_place, show_diff, check))) > 1:
        raise click.UsageError("choose at most one of -o, --in-place, --diff, --check")
    files = list(iter_python_files(paths))
    if output and len(files) != 1:
        raise click.UsageError("-o/--output takes exactly one input file")
    mode = "check" if check else "diff" if show_diff else "in-place" if in_place else "write"
    outcomes = [_convert_one(item, target, mode, output, batch_size, quiet, explicit=_named(item, paths), report_format=report_format)
                for item in files]
    if any(o.failed for o in outcomes):
        sys.exit(EXIT_ERROR)
    sys.exit(EXIT_FOUND if check and any(o.would_change for o in outcomes) else EXIT_OK)


def _named(item, paths) -> bool:
    return not isinstance(item, SourceError) and any(Path(p) == item for p in paths)


def _convert_one(item, target, mode, output, batch_size, quiet, explicit, report_format="text") -> Outcome:
    """Convert one file, report it, and never let its failure stop the others."""
    if isinstance(item, SourceError):
        return _fail(item)
    if item.suffix == ".ipynb":
        return _convert_notebook(item, target, mode, output, batch_size, quiet, report_format)
    try:
        source = read_source(item)
        if not mentions_torch(source.text):
            if explicit and not quiet:
                click.echo(f"{item}: does not use torch; left alone")
            return Outcome()
        check_syntax(source)
        from ddpify.convert import convert_source

        result = convert_source(source.text, target, path=str(item), batch_size=batch_size)
        _ensure_compiles(item, result.output)
    except SourceError as error:
        return _fail(error)
    except Exception as error:  # a bug in ddpify: report it against the file, go on with the others
        return _fail(f"{item}: internal error while converting ({type(error).__name__}: {error}); please report it")
    if report_format == "markdown":
        from ddpify.review import markdown_summary

        click.echo(markdown_summary(item, result, target), err=output == "-")
        if mode == "diff":  # the summary holds the diff
            return Outcome(would_change=result.changed)
    else:
        _report(item, result, quiet, to_stderr=mode in ("check", "diff") or output == "-")
    if not result.changed:
        return Outcome()
    return _emit(item, source, result, target, mode, output, quiet)


def _emit(item, source, result, target, mode, output, quiet) -> Outcome:
    if mode == "check":
        click.echo(f"would convert {item}")
        return Outcome(would_change=True)
    if mode == "diff":
        click.echo(_unified_diff(item, result.source, result.output), nl=False)
        return Outcome(would_change=True)
    if output == "-":
        click.echo(result.output, nl=False)
        return Outcome(would_change=True)
    if mode == "in-place" and not unchanged_since_read(source):
        return _fail(f"{item}: changed on disk while being converted; not overwritten (run again)")
    destination = _destination(item, target, mode, output)
    return _write(destination, lambda: source.encode(result.output), source.mode, quiet, LAUNCH[target].format(path=destination))


def _destination(item: Path, target: str, mode: str, output) -> Path:
    return Path(output) if output else item if mode == "in-place" else _default_output(item, target)


def _write(destination: Path, data, file_mode, quiet, launch: str) -> Outcome:
    """Write atomically (`data()` builds the bytes and may refuse), then say where and how to run it."""
    try:
        write_atomic(destination, data(), file_mode)
    except SourceError as error:
        return _fail(error)
    if not quiet:
        click.echo(f"wrote {destination}")
        click.echo(f"launch: {launch}")
    return Outcome(would_change=True)


def _convert_notebook(item, target, mode, output, batch_size, quiet, report_format) -> Outcome:
    """--to dp: a converted notebook (DataParallel runs in a kernel); --to ddp: a torchrun script."""
    import nbformat

    from ddpify.notebooks import convert_notebook, lint_location

    try:
        new_nb, result, cell_map = convert_notebook(item, target, batch_size)
        _ensure_compiles(item, result.output)
    except SourceError as error:
        return _fail(error)
    except Exception as error:  # unreadable notebook, lost cell markers, or a bug in ddpify
        return _fail(f"{item}: cannot convert this notebook ({type(error).__name__}: {error})")
    to_stderr = mode in ("check", "diff") or output == "-"
    if report_format == "markdown":
        from ddpify.review import markdown_summary

        click.echo(markdown_summary(item, result, target, locate=lambda line: lint_location(cell_map, line),
                                    warnings=cell_map.warnings), err=output == "-")
    else:
        for warning in cell_map.warnings:
            click.echo(f"{item}:{warning}", err=to_stderr)
        _report(item, result, quiet, to_stderr, locate=lambda line: lint_location(cell_map, line))
    if not result.changed:
        return Outcome()
    if mode == "check":
        click.echo(f"would convert {item}")
        return Outcome(would_change=True)
    if mode == "diff":
        if report_format != "markdown":
            click.echo(_unified_diff(item, result.source, result.output), nl=False)
        return Outcome(would_change=True)
    if target == "ddp":  # a DDP job cannot run inside a kernel: write a script for torchrun
        if mode == "in-place":
            return _fail(f"{item}: --to ddp makes a script for torchrun, not a notebook; use -o or the default output")
        text = result.output
        if output == "-":
            click.echo(text, nl=False)
            return Outcome(would_change=True)
        destination = Path(output) if output else item.with_name(f"{item.stem}_ddp.py")
        return _write(destination, lambda: text.encode("utf-8"), None, quiet, LAUNCH[target].format(path=destination))
    if output == "-":
        click.echo(nbformat.writes(new_nb) + "\n", nl=False)
        return Outcome(would_change=True)
    return _write(_destination(item, target, mode, output), lambda: _notebook_bytes(nbformat, new_nb), None, quiet, "run the notebook as before")


def _notebook_bytes(nbformat, notebook) -> bytes:
    """The notebook's JSON, refusing to write one that does not validate."""
    try:
        nbformat.validate(notebook)
    except nbformat.ValidationError as error:
        raise SourceError("<notebook>", f"converted notebook does not validate ({error.message}); nothing written") from None
    return (nbformat.writes(notebook) + "\n").encode("utf-8")


def _report(item, result, quiet, to_stderr, locate=str) -> None:
    """One line per change and per warning, located in the original file (`locate` maps a line)."""
    if result.note and not quiet:
        click.echo(f"{item}: {result.note}", err=to_stderr)
    for change in [] if quiet else result.changes:
        click.echo(f"{item}:{locate(change.line)}: [{change.transform}] {change.message}", err=to_stderr)
    for advice in result.advice:
        click.echo(f"{item}:{locate(advice.line)}: warning: {advice.message}", err=to_stderr)


def _default_output(path: Path, target: str) -> Path:
    return path.with_name(f"{path.stem}_{target}{path.suffix}")


def _ensure_compiles(path, text: str) -> None:
    try:
        compile(text, str(path), "exec", dont_inherit=True)
    except SyntaxError as error:
        raise SourceError(str(path), f"conversion produced invalid code ({error.msg}); nothing written, please report it", line=error.lineno) from None


def _unified_diff(path, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _fail(error) -> Outcome:
    click.echo(f"error: {error}", err=True)
    return Outcome(failed=True)


COMMANDS = (convert,)
