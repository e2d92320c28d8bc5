"""`ddpify lint`, `ddpify rules` and `ddpify rule CODE`."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Sequence

import click

from ddpify.exit_codes import EXIT_ERROR, EXIT_FOUND, EXIT_OK
from ddpify.lint.config import ConfigError, config_for, upper_all
from ddpify.lint.docs import fix_availability, kinds_text, render_rule
from ddpify.lint.engine import NOTEBOOK_SUFFIX, FileReport, Options, collect_files, lint_files, lint_text
from ddpify.lint.output import FORMATS, TEXT_FORMATS, diagnostic_parts, render
from ddpify.lint.output import statistics as render_statistics
from ddpify.lint import terminal
from ddpify.lint.registry import all_rules, rule_by_code


def _codes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    """Split a comma-separated list of rule codes or prefixes."""
    return None if value is None else upper_all(c for c in value.split(",") if c.strip())


@click.command("lint")
@click.argument("paths", nargs=-1, type=click.Path(path_type=str, readable=False))
@click.option("--select", callback=_codes, help="Comma-separated codes or prefixes to run (replaces the config's); ALL: every rule.")
@click.option("--ignore", callback=_codes, help="Comma-separated codes or prefixes to skip (replaces the config's).")
@click.option("--extend-select", callback=_codes, help="Codes to run in addition (e.g. rules that are off by default).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="pyproject.toml to read [tool.ddpify] from (default: the nearest one above the first path).")
@click.option("--output-format", type=click.Choice(FORMATS), default="text", show_default=True,
              help="full (text): each finding with its source line; concise: one line each.")
@click.option("--statistics", is_flag=True, help="Print the number of findings per rule instead of the findings.")
@click.option("--fix", is_flag=True, help="Apply fixes in place (safe ones; unsafe ones too with --unsafe-fixes).")
@click.option("--unsafe-fixes", is_flag=True, help="Enable unsafe fixes: applied with --fix, shown with --diff.")
@click.option("--diff", is_flag=True, help="Print the diff of the fixes instead of writing them.")
@click.option("--add-noqa", is_flag=True, help="Add a `# ddpify: ignore[CODE]` comment for every current finding.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings (errors still exit 2).")
@click.option("--stdin-filename", help="The file name to report (and to match per-file-ignores against) for `-`.")
@click.option("--color", "color", type=click.Choice(terminal.COLOR_CHOICES), default="auto", show_default=True,
              help="Colour findings and diffs: auto (a terminal, no NO_COLOR), always, never.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Worker processes [default: CPU count].")
@click.option("--no-progress", is_flag=True, help="No progress bar (there is none anyway when piped, in CI or with NO_COLOR).")
def lint_command(paths: Sequence[str], select, ignore, extend_select, config_path, output_format, statistics, fix,
                 unsafe_fixes, diff, add_noqa, exit_zero, stdin_filename, color, jobs, no_progress) -> None:
    """Find multi-GPU pitfalls in PyTorch scripts and notebooks under PATHS (default: .; `-`: stdin).

    Notebooks are linted as their joined code cells and findings are located by cell; --fix and
    --diff leave notebooks unchanged (not supported yet). With `-`, --fix prints the fixed source.

    Exit status: 0 nothing found, 1 findings (with --diff: fixes to apply), 2 a file or the config had errors.
    """
    started = time.perf_counter()
    paths = tuple(paths) or (".",)
    reading_stdin = paths == ("-",)
    try:
        config = config_for(stdin_filename or "." if reading_stdin else paths[0], config_path)
        config = config.with_overrides(select, ignore, extend_select)
        config.validate(all_rules())
    except ConfigError as e:
        click.echo(f"ddpify: {e}", err=True)
        raise SystemExit(EXIT_ERROR)
    options = Options(config=config, fix=fix, diff=diff, unsafe_fixes=unsafe_fixes, add_noqa=add_noqa)
    if reading_stdin:
        reports, errors, fixed = _lint_stdin(stdin_filename or "-", options)
    else:
        files, errors = collect_files(paths, config, writing=(fix or add_noqa) and not diff)
        with terminal.progress_bar(len(files), "ddpify lint", terminal.use_progress(len(files), no_progress)) as advance:
            reports, fixed = lint_files(files, options, jobs, progress=advance), None
    errors += [e for r in reports for e in r.errors]
    diagnostics = [d for r in reports for d in r.diagnostics]
    out = sys.stderr if reading_stdin and fix and not diff else sys.stdout  # stdin --fix: the fixed source owns stdout
    if add_noqa:
        added = sum(r.directives_added for r in reports)
        click.echo(f"ddpify: added {added} suppression comment{'s' * (added != 1)}", err=True)
    elif diff:
        _echo_diff("".join(r.diff for r in reports), color)
    elif statistics:
        click.echo(render_statistics(output_format, diagnostics, options.wants), nl=False, file=out)
    elif output_format in TEXT_FORMATS and diagnostics and terminal.use_colour(out, color):
        for d in diagnostics:
            terminal.echo_parts(diagnostic_parts(output_format, d), out)
    else:
        click.echo(render(output_format, diagnostics, all_rules(), errors), nl=False, file=out)
    if fixed is not None and fix and not diff:
        click.echo(fixed, nl=False)
    for note in (n for r in reports for n in r.notes):
        click.echo(f"ddpify: {note}", err=True)
    for error in errors:
        click.echo(error, err=True)
    if output_format in TEXT_FORMATS and not add_noqa:
        click.echo(_summary(reports, time.perf_counter() - started, options, diff), err=True)
    raise SystemExit(_exit_code(reports, errors, diff, exit_zero or add_noqa))


def _lint_stdin(name: str, options: Options) -> tuple[list[FileReport], list[str], str | None]:
    """Lint the script on stdin as `name`: its report, errors, and the source after fixes."""
    if name.endswith(NOTEBOOK_SUFFIX):
        return [], [f"{name}: notebooks cannot be read from stdin"], None
    text = click.open_file("-").read()  # stdin, as text (click.get_text_stream is deprecated in Click 8.5)
    report, fixed = lint_text(text, name, options)
    return [report], [], fixed


def _echo_diff(diff: str, color: str) -> None:
    if diff and terminal.use_colour(sys.stdout, color):
        terminal.echo_parts(terminal.diff_parts(diff))
    else:
        click.echo(diff, nl=False)


def _exit_code(reports: Sequence[FileReport], errors: Sequence[str], diff: bool, exit_zero: bool) -> int:
    if errors:
        return EXIT_ERROR
    if exit_zero:
        return EXIT_OK
    found = any(r.diff for r in reports) if diff else any(r.diagnostics for r in reports)
    return EXIT_FOUND if found else EXIT_OK


def _summary(reports: Sequence[FileReport], seconds: float, options: Options, diff: bool) -> str:
    """One line: files scanned, findings by code, fixes, time."""
    scanned = sum(not r.skipped for r in reports)
    skipped = len(reports) - scanned
    by_code = Counter(d.code for r in reports for d in r.diagnostics)
    safety = Counter(d.fix.safe for r in reports for d in r.diagnostics
                     if d.fix is not None and not r.path.endswith(NOTEBOOK_SUFFIX))  # notebooks: no fixes yet
    fixed = sum(r.fixes_applied for r in reports)
    parts = [f"{scanned} file{'s' * (scanned != 1)} scanned" + (f" ({skipped} without torch skipped)" if skipped else "")]
    total = sum(by_code.values())
    codes = ", ".join(f"{code}: {n}" for code, n in sorted(by_code.items()))
    parts.append(f"{total} finding{'s' * (total != 1)}" + (f" ({codes})" if codes else ""))
    if options.fix or diff:
        parts.append(f"{fixed} fix{'es' * (fixed != 1)} {'to apply' if diff else 'applied'}")
    elif options.unsafe_fixes:
        if safety[True] + safety[False]:
            parts.append(f"{safety[True] + safety[False]} fixable with --fix")
    else:
        if safety[True]:
            parts.append(f"{safety[True]} fixable with --fix")
        if safety[False]:
            parts.append(f"{safety[False]} with --unsafe-fixes")
    return f"ddpify: {', '.join(parts)} in {seconds:.2f}s"


@click.command("rules")
def rules_command() -> None:
    """List every lint rule: code, name, the kinds of script it checks, its fix, on by default."""
    rows = [("CODE", "NAME", "APPLIES TO", "FIX", "DEFAULT")]
    rows += [(r.code, r.name, kinds_text(r), fix_availability(r), "on" if r.default_enabled else "off") for r in all_rules()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


@click.command("rule")
@click.argument("code")
def rule_command(code: str) -> None:
    """Print the documentation of rule CODE."""
    rule = rule_by_code(code)
    if rule is None:
        click.echo(f"ddpify: no rule {code!r}; `ddpify rules` lists them", err=True)
        raise SystemExit(EXIT_ERROR)
    click.echo(render_rule(rule), nl=False)


COMMANDS = (lint_command, rules_command, rule_command)
