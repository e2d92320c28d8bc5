"""Explain a run that did not finish: the traceback's last line, or where a hung process sat.

Imports the standard library only.
"""

from __future__ import annotations

import linecache
import os
import re

_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+),? in (?P<func>.+)$')  # dumps and tracebacks
_THREAD = re.compile(r"^(Current thread|Thread) ")


def last_line(path: str) -> str:
    """The last non-blank line of a text file (a traceback's exception line)."""
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else "(empty traceback)"


def _threads(dump: str) -> list[list[tuple[str, str, str]]]:
    """(file, line, function) frames, innermost first, for each thread of a faulthandler dump."""
    threads: list[list[tuple[str, str, str]]] = []
    for text in dump.splitlines():
        if _THREAD.match(text):
            threads.append([])
        elif (frame := _FRAME.match(text)) and threads:
            threads[-1].append((frame["file"], frame["line"], frame["func"]))
    return threads


def hang_location(stack_path: str, script: str) -> str | None:
    """`file:line in func` of the innermost frame inside `script`, else of the main thread's innermost frame."""
    if not os.path.exists(stack_path):
        return None
    with open(stack_path, errors="replace") as f:
        threads = [frames for frames in _threads(f.read()) if frames]
    if not threads:
        return None
    script = os.path.realpath(script)
    in_script = [frame for frames in threads for frame in frames if os.path.realpath(frame[0]) == script]
    file, line, func = in_script[0] if in_script else threads[-1][0]
    return f"{os.path.basename(file)}:{line} in {func}"


def raise_location(traceback_path: str, script: str) -> str | None:
    """`file:line `source`` of the innermost frame of a traceback inside `script`, or None."""
    with open(traceback_path, errors="replace") as f:
        frames = [(frame["file"], int(frame["line"])) for text in f if (frame := _FRAME.match(text.rstrip()))]
    in_script = [frame for frame in frames if os.path.realpath(frame[0]) == os.path.realpath(script)]
    if not in_script:
        return None
    file, line = in_script[-1]
    return f"{os.path.basename(file)}:{line} `{linecache.getline(file, line).strip()}`"
