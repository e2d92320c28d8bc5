"""Terminal niceties for `ddpify lint`: a progress bar for many files and coloured codes/paths.

Everything degrades to plain text: no colour and no progress bar when stdout is not a terminal,
when NO_COLOR is set (https://no-color.org), in CI (the `CI` variable), or (progress only) with
--no-progress. DDPIFY_FORCE_TERMINAL=1 treats the streams as terminals (tests, `script`-less
pagers); NO_COLOR still wins over it. rich draws both, and is imported only when needed: without
it the output is plain.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TextIO

PROGRESS_MIN_FILES = 20  # a bar for more files than this
_STYLES = {"path": "bold", "severity-error": "bold red", "severity-warning": "bold yellow", "severity-info": "bold cyan",
           "diff-add": "green", "diff-remove": "red", "diff-hunk": "cyan", "diff-file": "bold"}


def diff_parts(diff: str) -> list[tuple[str, str | None]]:
    """A unified diff as (text, role) pieces, one per line, for `echo_parts`."""
    return [(line, _diff_role(line)) for line in diff.splitlines(keepends=True)]


def _diff_role(line: str) -> str | None:
    if line.startswith(("+++", "---")):
        return "diff-file"
    if line.startswith("@@"):
        return "diff-hunk"
    return {"+": "diff-add", "-": "diff-remove"}.get(line[:1])


def _forced() -> bool:
    return os.environ.get("DDPIFY_FORCE_TERMINAL", "") not in ("", "0")


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def interactive(stream: TextIO | None = None) -> bool:
    """Whether `stream` (stdout by default) is a terminal we may decorate: not in CI, or forced."""
    if _forced():
        return True
    return _is_tty(stream or sys.stdout) and not _in_ci()


COLOR_CHOICES = ("auto", "always", "never")


def use_colour(stream: TextIO | None = None, mode: str = "auto") -> bool:
    """Colour `stream`? `always` and `never` (--color) decide; `auto` asks the terminal and NO_COLOR."""
    if mode == "never" or _rich() is None:
        return False
    return mode == "always" or (not os.environ.get("NO_COLOR") and interactive(stream))


def use_progress(count: int, no_progress: bool) -> bool:
    """A progress bar (on stderr) for many files, when both stdout and stderr are terminals."""
    return (not no_progress and count > PROGRESS_MIN_FILES and not os.environ.get("NO_COLOR")
            and interactive(sys.stdout) and interactive(sys.stderr) and _rich() is not None)


def _rich():
    try:
        import rich  # noqa: F401  (optional: plain output without it)
    except ImportError:
        return None
    return rich


def echo_parts(parts: Sequence[tuple[str, str | None]], stream: TextIO | None = None) -> None:
    """Write (text, role) pieces, colouring the roles in _STYLES."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream or sys.stdout, force_terminal=True, soft_wrap=True, highlight=False,
                      color_system="standard")
    text = Text()
    for piece, role in parts:
        text.append(piece, style=_STYLES.get(role or "", ""))
    console.print(text, end="")


@contextmanager
def progress_bar(total: int, label: str, enabled: bool) -> Iterator[Callable[[object], None]]:
    """A context giving a callback to call once per finished file; a no-op when not `enabled`."""
    if not enabled:
        yield lambda _report: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr, force_terminal=True)
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda _report: bar.advance(task)
