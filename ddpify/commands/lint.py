"""`ddpify lint`, `ddpify rules` and `ddpify rule CODE`."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Sequence

import click

from ddpify.commands import EXIT_ERROR, EXIT_FOUND, EXIT_OK
from ddpify.lint.config import Config, ConfigError, find_config, load_config, upper_all
from ddpify.lint.docs import fix_availability, kinds_text, render_rule
from ddpify.lint.engine import FileReport, Options, collect_files, lint_files
from ddpify.lint.engine import NOTEBOOK_SUFFIX
from ddpify.lint.output import FORMATS, render, text_parts
from ddpify.lint import terminal
from ddpify.lint.registry import all_rules, rule_by_code


def _codes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    """Split a comma-separated list of rule codes or prefixes."""
    return None if value is None else upper_all(c for c in value.split(",") if c.strip())


@click.command("lint")
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--select", callback=_codes, help="Comma-separated codes or prefixes to run (replaces the config's).")
@click.option("--ignore", callback=_codes, help="Comma-separated codes or prefixes to skip (replaces the config's).")
@click.option("--extend-select", callback=_codes, help="Codes to run in addition (e.g. rules that are off by default).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="pyproject.toml to read [tool.ddpify] from (default: the nearest one above the first path).")
@click.option("--output-format", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--fix", is_flag=True, help="Apply safe fixes in place.")
@click.option("--unsafe-fixes", is_flag=True, help="Apply unsafe fixes too (implies --fix unless --diff).")
@click.option("--diff", is_flag=True, help="Print the diff of the fixes instead of writing them.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Worker processes [default: CPU count].")
@click.option("--no-progress", is_flag=True, help="No progress bar (there is none anyway when piped, in CI or with NO_COLOR).")
def lint_command(paths: Sequence[str], select, ignore, extend_select, config_path, output_format, fix,
                 unsafe_fixes, diff, jobs, no_progress) -> None:
    """Find multi-GPU pitfalls in PyTorch scripts and notebooks under PATHS (default: .).

    Notebooks are linted as their joined code cells and findings are located by cell; --fix and
    --diff leave notebooks unchanged (not supported yet).

    Exit status: 0 nothing found, 1 findings (with --diff: fixes to apply), 2 a file or the config had errors.
    """
    started = time.perf_counter()
    paths = tuple(paths) or (".",)
    try:
        config = _config(config_path, paths[0]).with_overrides(select, ignore, extend_select)
        config.validate(all_rules())
    except ConfigError as e:
        click.echo(f"ddpify: {e}", err=True)
        raise SystemExit(EXIT_ERROR)
    files, errors = collect_files(paths, config)
    options = Options(config=config, fix=fix or unsafe_fixes, diff=diff, unsafe_fixes=unsafe_fixes)
    with terminal.progress_bar(len(files), "ddpify lint", terminal.use_progress(len(files), no_progress)) as advance:
        reports = lint_files(files, options, jobs, progress=advance)
    errors += [e for r in reports for e in r.errors]
    diagnostics = [d for r in reports for d in r.diagnostics]
    if diff:
        click.echo("".join(r.diff for r in reports), nl=False)
    elif output_format == "text" and diagnostics and terminal.use_colour():
        for d in diagnostics:
            terminal.echo_parts(text_parts(d) + [("\n", None)])
    else:
        click.echo(render(output_format, diagnostics, all_rules(), errors), nl=False)
    for note in (n for r in reports for n in r.notes):
        click.echo(f"ddpify: {note}", err=True)
    for error in errors:
        click.echo(error, err=True)
    if output_format == "text":
        click.echo(_summary(reports, time.perf_counter() - started, options.fix or diff, diff), err=True)
    raise SystemExit(_exit_code(reports, errors, diff))


def _config(config_path: str | None, first_path: str) -> Config:
    """The config named on the command line, else the nearest above the first path, else defaults."""
    return load_config(config_path or find_config(first_path if Path(first_path).exists() else "."))


def _exit_code(reports: Sequence[FileReport], errors: Sequence[str], diff: bool) -> int:
    if errors:
        return EXIT_ERROR
    found = any(r.diff for r in reports) if diff else any(r.diagnostics for r in reports)
    return EXIT_FOUND if found else EXIT_OK


def _summary(reports: Sequence[FileReport], seconds: float, fixing: bool, diff: bool) -> str:
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
    if fixing:
        parts.append(f"{fixed} fix{'es' * (fixed != 1)} {'to apply' if diff else 'applied'}")
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
