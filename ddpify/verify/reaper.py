"""Nothing a verified script starts may outlive verify, not even a child that left the group.

Killing the launcher's process group ends the ranks and their DataLoader workers, but a child
that called setsid() is in a session of its own, and once its parent is gone it is re-parented
away from verify. While verify runs, the command's process is therefore a child subreaper
(Linux prctl PR_SET_CHILD_SUBREAPER): such orphans are re-parented to it instead, so they stay
in its process tree, where `kill_descendants` finds them through /proc. Standard library only.

A launch that runs beside others in the same process (bench/run_converted.py's threads) cannot be a
subreaper's alone: it marks its processes instead, with LAUNCH_VARIABLE in their environment, and
`kill_launch` ends every process carrying its mark, wherever it moved (kill_tree misses the orphans of
a root that already ended: they are re-parented away from it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from contextlib import contextmanager
from typing import Iterator

PR_SET_CHILD_SUBREAPER = 36
LAUNCH_VARIABLE = "DDPIFY_LAUNCH"  # every process of one marked launch inherits its token
KILL_GRACE_S = 5.0  # a process killed with SIGKILL is gone within this, even on a loaded machine


@contextmanager
def adopting_orphans() -> Iterator[frozenset[int]]:
    """Be the subreaper of what starts inside the block; yields the children that existed before."""
    before = frozenset(_process_tree(os.getpid()))
    _set_subreaper(True)
    try:
        yield before
    finally:
        _set_subreaper(False)


def kill_descendants(spared: frozenset[int]) -> None:
    """SIGKILL every process below this one except `spared` and theirs, and reap them."""
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        tree = _process_tree(os.getpid(), spared)
        if not tree:
            return
        for pid, (_, state) in tree.items():
            if state != "Z":
                _kill(pid)
        _reap(pid for pid, (parent, _) in tree.items() if parent == os.getpid())
        time.sleep(0.01)


def kill_tree(root: int) -> None:
    """SIGKILL `root` and every process below it, those in sessions of their own included (torchrun's
    workers): the tree is read before anything is killed, since the orphans of a killed parent move away."""
    for pid in [root, *_process_tree(root)]:
        _kill(pid)


def kill_group(pgid: int) -> None:
    """SIGKILL the process group `pgid` (that of a process started with start_new_session=True)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_launch(root: int, token: str) -> None:
    """SIGKILL a marked launch started as `root` in a session of its own: its tree (while `root` lives),
    its group, and every process whose environment carries LAUNCH_VARIABLE=`token`, until none is left
    (a killed process keeps its environment readable for a moment; KILL_GRACE_S at most)."""
    kill_tree(root)
    kill_group(root)
    deadline = time.monotonic() + KILL_GRACE_S
    while (left := _marked(token)) and time.monotonic() < deadline:
        for pid in left:
            _kill(pid)
        time.sleep(0.01)


def _marked(token: str) -> list[int]:
    """The processes whose environment (as they were started) holds LAUNCH_VARIABLE=`token`."""
    mark = f"{LAUNCH_VARIABLE}={token}".encode()
    found = []
    for pid in _process_table():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
    return found


def _process_tree(root: int, spared: frozenset[int] = frozenset()) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) for every process below `root`, minus `spared` and their subtrees."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: dict[int, tuple[int, str]] = {}
    stack = [pid for pid in children.get(root, []) if pid not in spared]
    while stack:
        pid = stack.pop()
        found[pid] = table[pid]
        stack.extend(children.get(pid, []))
    return found


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process, from /proc/<pid>/stat (empty without /proc)."""
    table = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (command) "
        table[int(name)] = (int(fields[1]), fields[0])
    return table


def _set_subreaper(on: bool) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(children: Iterator[int]) -> None:
    for pid in children:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
