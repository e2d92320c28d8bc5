"""Finding the Python files and notebooks under the paths a user names.

A directory is walked in sorted order, skipping hidden directories, virtualenvs, caches, build output
and what `.gitignore` files or `--exclude` patterns match; a file named explicitly is always taken.
Problems (a missing path, an unreadable directory, a symlink loop) become `SourceError`s to report.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import pathspec

from ddpify.sources import SourceError, describe_os_error

PYTHON_SUFFIXES = (".py", ".ipynb")
_SKIPPED_DIR_NAMES = frozenset(
    {"__pycache__", "build", "dist", "node_modules", "site-packages", "venv", "env"}
)
_Ignores = tuple[tuple[str, pathspec.PathSpec], ...]  # (base dir relative to the walked root, spec)


@dataclass(frozen=True)
class _Dir:
    """A directory waiting to be walked, with the ignore rules in force inside it."""

    path: str  # as it will be shown (under the root as given)
    rel: str  # relative to the walked root, posix, "" for the root
    real: str  # realpath, for loop detection
    ancestors: frozenset[str]  # realpaths of the directories above it in this walk
    ignores: _Ignores


def iter_python_files(
    paths: Iterable[str | os.PathLike],
    exclude: Sequence[str] = (),
    respect_gitignore: bool = True,
    writing: bool = False,
) -> Iterator[Path | SourceError]:
    """Yield the Python files (``*.py``, ``*.ipynb``) named by or found under ``paths``.

    A named file is yielded as is. Directories are walked in sorted order, skipping hidden
    directories, virtualenvs, caches and build output, and whatever ``.gitignore`` files in
    the tree (if ``respect_gitignore``) or ``exclude`` patterns (gitignore syntax, relative
    to the walked root) match. Problems (missing path, unreadable directory, symlink loop)
    are yielded as ``SourceError`` so the caller can report them and go on. No file is
    yielded twice and no directory is walked twice. When the caller is ``writing`` (``--in-place``,
    ``--fix``), a symlink inside a walked directory that leads outside it is skipped, with a
    ``SourceError`` saying so: ddpify writes only inside the paths it was given.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    exclude_spec = pathspec.GitIgnoreSpec.from_lines(exclude) if exclude else None
    seen_files: set[str] = set()
    seen_dirs: set[str] = set()
    for given in paths:
        given = os.fspath(given)
        try:
            is_dir = stat.S_ISDIR(os.stat(given).st_mode)
        except OSError as e:
            yield SourceError(given, describe_os_error(e))
            continue
        if not is_dir:
            if _first_time(os.path.realpath(given), seen_files):
                yield Path(given)
            continue
        yield from _walk(given, exclude_spec, respect_gitignore, seen_files, seen_dirs, writing)


def _first_time(key: str, seen: set[str]) -> bool:
    if key in seen:
        return False
    seen.add(key)
    return True


def _walk(
    root: str,
    exclude_spec: pathspec.PathSpec | None,
    respect_gitignore: bool,
    seen_files: set[str],
    seen_dirs: set[str],
    writing: bool,
) -> Iterator[Path | SourceError]:
    """Depth-first, sorted walk of one root directory."""
    root_real = os.path.realpath(root)
    if not _first_time(root_real, seen_dirs):
        return
    base_ignores = (("", exclude_spec),) if exclude_spec else ()
    stack = [_Dir(root, "", root_real, frozenset(), base_ignores)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current.path) as it:
                entries = sorted(it, key=lambda entry: entry.name)
        except OSError as e:
            yield SourceError(current.path, f"cannot read directory: {describe_os_error(e)}")
            continue
        ignores = current.ignores
        if respect_gitignore:
            ignores = _with_gitignore(current, entries, ignores)
        subdirs = []
        for entry in entries:
            result = _classify(entry, current, ignores, root_real, seen_files, seen_dirs, writing)
            if isinstance(result, _Dir):
                subdirs.append(result)
            elif result is not None:
                yield result
        stack.extend(reversed(subdirs))


def _with_gitignore(current: _Dir, entries: list[os.DirEntry], ignores: _Ignores) -> _Ignores:
    """Add the directory's own .gitignore (if any) to the rules in force."""
    for entry in entries:
        if entry.name == ".gitignore" and entry.is_file():
            try:
                with open(entry.path, "rb") as f:
                    lines = f.read().decode("utf-8", "replace").splitlines()
            except OSError:
                return ignores  # an unreadable .gitignore just doesn't apply
            return ignores + ((current.rel, pathspec.GitIgnoreSpec.from_lines(lines)),)
    return ignores


def _classify(
    entry: os.DirEntry,
    current: _Dir,
    ignores: _Ignores,
    root_real: str,
    seen_files: set[str],
    seen_dirs: set[str],
    writing: bool,
) -> _Dir | Path | SourceError | None:
    """What to do with one directory entry: a ``_Dir`` to walk, a file or error to yield, or None."""
    rel = f"{current.rel}/{entry.name}" if current.rel else entry.name
    try:
        if entry.is_symlink():
            os.stat(entry.path)  # a dangling link raises FileNotFoundError, a loop ELOOP
        is_dir = entry.is_dir()
    except FileNotFoundError:
        return None  # dangling symlink (e.g. an editor lock file): not a source file
    except OSError as e:
        if _skipped_dir_name(entry.name) or _ignored(rel, ignores, is_dir=True):
            return None
        return SourceError(entry.path, describe_os_error(e))
    if is_dir:
        return _subdir(entry, current, rel, ignores, root_real, seen_dirs, writing)
    if not entry.name.endswith(PYTHON_SUFFIXES) or _ignored(rel, ignores, is_dir=False):
        return None
    real = os.path.realpath(entry.path)
    if writing and not _inside(real, root_real):
        return _outside_link(entry.path, real)
    if _first_time(real, seen_files):
        return Path(entry.path)
    return None


def _subdir(
    entry: os.DirEntry, current: _Dir, rel: str, ignores: _Ignores, root_real: str, seen_dirs: set[str],
    writing: bool,
) -> _Dir | SourceError | None:
    """A ``_Dir`` for a subdirectory worth walking, a ``SourceError`` for a loop, or None."""
    if _skipped_dir_name(entry.name) or _is_virtualenv(entry.path):
        return None
    if _ignored(rel, ignores, is_dir=True):
        return None
    real = os.path.realpath(entry.path)
    ancestors = current.ancestors | {current.real}
    if entry.is_symlink():
        if real in ancestors:
            return SourceError(entry.path, f"symlink loop (points back to {real})")
        if _inside(real, root_real):
            return None  # inside this walk already: walked as the real directory
        if writing:
            return _outside_link(entry.path, real)
    if not _first_time(real, seen_dirs):
        return None
    return _Dir(entry.path, rel, real, ancestors, ignores)


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _outside_link(path: str, real: str) -> SourceError:
    return SourceError(path, f"skipped: a symlink to {real}, outside the directory given; "
                             "ddpify writes only inside the paths it is given (name the target to include it)")


def _skipped_dir_name(name: str) -> bool:
    return name.startswith(".") or name in _SKIPPED_DIR_NAMES or name.endswith(".egg-info")


def _is_virtualenv(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def _ignored(rel: str, ignores: _Ignores, *, is_dir: bool) -> bool:
    """Does any .gitignore / exclude spec in force match ``rel`` (relative to the walked root)?"""
    for base, spec in ignores:
        local = rel[len(base) + 1 :] if base else rel
        if spec.match_file(local + "/" if is_dir else local):
            return True
    return False
