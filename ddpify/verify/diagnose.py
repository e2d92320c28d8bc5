"""Explain a run that did not finish: the exception its traceback names, or where a hung process sat.

Imports the standard library only.
"""

from __future__ import annotations

import itertools
import linecache
import os
import re
from dataclasses import dataclass

_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+),? in (?P<func>.+)$')  # dumps and tracebacks
_THREAD = re.compile(r"^(Current thread|Thread) ")
_TRACEBACK = "Traceback (most recent call last):"
_FATAL = re.compile(r"^Fatal Python error: (.+)$", re.M)
SLOW_START = "(a slow start on a busy machine: raise --timeout)"  # how a run still starting at its deadline is reported
_LIBRARY_DIRS = ("site-packages", "dist-packages")


def exception_line(text: str) -> str:
    """The line that names the exception of the last traceback in `text` (`AttributeError: module 'numpy' has
    no attribute 'int'`): the first unindented line after its frames, not the last line of a message that goes
    on for several lines. Without a traceback, the last non-blank line."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    body = lines[starts[-1] + 1:] if starts else []
    named = next((line.strip() for line in body if line.strip() and not line[0].isspace()), None)
    return named or next((line.strip() for line in reversed(lines) if line.strip()), "(empty traceback)")


def exception_line_in(path: str) -> str:
    """exception_line of a text file (a traceback a run wrote, a launcher's log)."""
    with open(path, errors="replace") as f:
        return exception_line(f.read())


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def source(self) -> str:
        return linecache.getline(self.file, self.line).strip()

    def __str__(self) -> str:
        source = self.source()
        return f"{os.path.basename(self.file)}:{self.line} in {self.function}" + (f" `{source}`" if source else "")


@dataclass(frozen=True)
class Stuck:
    """Where a hung process sat: the call it waits in (the innermost frame, when it is not the
    script's own) and the script's frames, innermost first."""

    waits_in: Frame | None
    script: tuple[Frame, ...]
    importing: str | None = None  # the module an import is loading there: the process is still starting up

    def __str__(self) -> str:
        where = f"at {self.script[0]}" if self.script else ""
        waiting = f"waiting in {self.waits_in.function} ({_short(self.waits_in.file)}:{self.waits_in.line})" if self.waits_in else ""
        return ", ".join(part for part in (where, waiting) if part) or "(no Python frame)"


def _short(path: str) -> str:
    """A library file from its package down (`torch/distributed/distributed_c10d.py`), else its name."""
    parts = path.replace(os.sep, "/").split("/")
    return "/".join(parts[parts.index("torch"):]) if "torch" in parts else os.path.basename(path)


def _threads(dump: str) -> list[list[Frame]]:
    """The frames, innermost first, of each thread of a faulthandler dump."""
    threads: list[list[Frame]] = []
    for text in dump.splitlines():
        if _THREAD.match(text):
            threads.append([])
        elif (frame := _FRAME.match(text)) and threads:
            threads[-1].append(Frame(frame["file"], int(frame["line"]), frame["func"]))
    return threads


def _module_loading(frames: list[Frame], code: tuple[str, ...]) -> str | None:
    """The module (`torch/distributed/tensor/_ops/_pointwise_ops.py`) whose top level a thread runs inside an
    import, inside the script's innermost frame (a dump cut short, 100 frames deep in an import, has none of them)."""
    inner = list(itertools.takewhile(lambda frame: not is_script_code(frame.file, code), frames))
    if not any(frame.file.startswith("<frozen importlib") for frame in inner):
        return None
    return next((_short(frame.file) for frame in inner if frame.function == "<module>"), None)


def is_script_code(file: str, directories: tuple[str, ...]) -> bool:
    """Is `file` the user's code: inside one of `directories` and not an installed package? (Frames name real
    files by absolute paths; `<frozen runpy>` is no file, wherever this process runs.)"""
    real = os.path.realpath(file)
    return os.path.isabs(file) and not any(part in real.split(os.sep) for part in _LIBRARY_DIRS) and any(
        real == directory or real.startswith(directory + os.sep) for directory in map(os.path.realpath, directories))


def stuck_at(dump: str, code: tuple[str, ...]) -> Stuck | None:
    """Where the thread of a faulthandler dump that runs the user's code (files in or under `code`)
    sat, else the main thread (listed last); None for an empty dump."""
    threads = [frames for frames in _threads(dump) if frames]
    if not threads:
        return None
    frames = next((frames for frames in threads if any(is_script_code(f.file, code) for f in frames)), threads[-1])
    script = tuple(frame for frame in frames if is_script_code(frame.file, code))
    innermost = frames[0]
    return Stuck(None if is_script_code(innermost.file, code) else innermost, script, _module_loading(frames, code))


def fatal_error_in(stack_path: str) -> str | None:
    """What a faulthandler dump written as its process died says it died of (`Aborted`), or None."""
    with open(stack_path, errors="replace") as f:
        found = _FATAL.search(f.read())
    return found[1] if found else None


def stuck_in(stack_path: str, code: tuple[str, ...]) -> Stuck | None:
    """stuck_at of a dump file; None when there is none or it is empty (the process never hung)."""
    if not os.path.exists(stack_path):
        return None
    with open(stack_path, errors="replace") as f:
        return stuck_at(f.read(), code)


def raise_location(traceback_path: str, script: str) -> str | None:
    """`file:line `source`` of the innermost frame of a traceback inside `script`, or None."""
    with open(traceback_path, errors="replace") as f:
        frames = [(frame["file"], int(frame["line"])) for text in f if (frame := _FRAME.match(text.rstrip()))]
    in_script = [frame for frame in frames if os.path.realpath(frame[0]) == os.path.realpath(script)]
    if not in_script:
        return None
    file, line = in_script[-1]
    return f"{os.path.basename(file)}:{line} `{linecache.getline(file, line).strip()}`"
