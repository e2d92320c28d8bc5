"""The folder verify mirrors: the working directory, or the project root above it that the run reaches.

A script run from `implementations/cyclegan` that reads `../../data/monet2photo`, one run from `pygcn/`
with `PYTHONPATH=..` that imports the `pygcn` package, or one that adds `Path(__file__).parents[2]` to
`sys.path` reaches above the working directory: a mirror of the working directory alone misses those
files. verify mirrors the highest folder the run reaches instead (or the one `--root` names), and each
side runs in its mirror of the working directory.

The reaches are read without running anything: the relative paths typed (the script, the arguments
after `--`), the relative entries of PYTHONPATH, the string literals of the scripts that start with
`..` (`"../../data/%s"`, `os.path.join("..", "data")`) and the folders their `sys.path` edits add.
On its own, verify never mirrors a folder at the top of the filesystem (`/`, `/work`), the home or
the temp directory, or one above them: it mirrors the working directory and says what lies outside.
"""

from __future__ import annotations

import ast
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddpify.anatomy.search_path import added_paths

MIN_ROOT_DEPTH = 3  # parts of the shallowest folder found on its own: ('/', 'home', 'project')


@dataclass(frozen=True)
class Reach:
    """A folder the run reaches, and what reaches it (`../../data/%s at cyclegan.py:121`)."""

    folder: Path
    because: str


@dataclass(frozen=True)
class Root:
    """The folder to mirror, and a note for the report when it is not the working directory."""

    folder: Path
    note: str | None = None


def project_root(cwd: Path, scripts: list[Path], typed: list[str], pythonpath: str) -> Root:
    """The folder verify mirrors for a run from `cwd` of `scripts` (typed as `typed`, with the script's arguments)."""
    cwd = cwd.resolve()
    reaches = typed_reaches(cwd, typed)
    typed_root = Path(os.path.commonpath([cwd, *(reach.folder for reach in reaches)]))
    reaches += pythonpath_reaches(cwd, pythonpath)
    for script in scripts:  # a script typed from elsewhere runs where it is: what it reaches is its own
        reaches += script_reaches(cwd, script) if script.resolve().is_relative_to(typed_root) else []
    above = [reach for reach in reaches if not reach.folder.is_relative_to(cwd)]
    if not above:
        return Root(cwd)
    folder = Path(os.path.commonpath([cwd, *(reach.folder for reach in above)]))
    because = "; ".join(dict.fromkeys(reach.because for reach in above))
    refusal = _too_wide(folder)
    if refusal:
        return Root(cwd, f"the run reaches outside the working directory ({because}), but verify does not mirror "
                         f"{folder} on its own ({refusal}): each side runs in a mirror of {cwd} only; pass --root "
                         f"to mirror a folder above it")
    return mirrored_note(folder, cwd, because)


def given_root(root: str, cwd: Path) -> Root:
    """The folder `--root` names, which must enclose the working directory."""
    folder, cwd = Path(root).resolve(), cwd.resolve()
    if not cwd.is_relative_to(folder):
        raise ValueError(f"--root {root} does not enclose the working directory {cwd}")
    return mirrored_note(folder, cwd, "--root") if folder != cwd else Root(cwd)


def mirrored_note(folder: Path, cwd: Path, because: str) -> Root:
    return Root(folder, f"each side runs in a mirror of {folder} ({because}), in its {cwd.relative_to(folder)}")


def _too_wide(folder: Path) -> str | None:
    """Why `folder` is too wide to mirror unasked, or None."""
    special = {"the home directory": Path.home().resolve(), "the temp directory": Path(tempfile.gettempdir()).resolve()}
    named = [name for name, path in special.items() if path == folder]
    if named:
        return named[0]
    if len(folder.parts) < MIN_ROOT_DEPTH:
        return "a folder at the top of the filesystem"
    held = [name for name, path in special.items() if path.is_relative_to(folder)]
    return f"it holds {held[0]}" if held else None


def typed_reaches(cwd: Path, typed: list[str]) -> list[Reach]:
    """Folders that relative paths typed on the command line (the script, `--data=../data`) reach."""
    reaches = []
    for argument in typed:
        value = argument.partition("=")[2] if argument.startswith("-") else argument
        reaches += [Reach(folder, f"`{argument}`") for folder in [_reached(cwd, value)] if folder]
    return reaches


def pythonpath_reaches(cwd: Path, pythonpath: str) -> list[Reach]:
    """The folders that relative PYTHONPATH entries name (resolved, as Python does, from the working directory)."""
    return [Reach((cwd / entry).resolve(), f"PYTHONPATH={entry}")
            for entry in filter(None, pythonpath.split(os.pathsep)) if not os.path.isabs(entry)]


def script_reaches(cwd: Path, script: Path) -> list[Reach]:
    """Folders a script's `..` literals reach from the working directory, and those its `sys.path` edits add."""
    try:
        tree = ast.parse(script.read_text(), str(script))
    except (OSError, SyntaxError, ValueError):
        return []
    reaches = [Reach(folder.resolve(), f"sys.path gets {folder} in {script.name}") for folder in added_paths(script, tree)]
    for node, text in _path_literals(tree):
        folder = _reached(cwd, text)
        if folder:
            reaches.append(Reach(folder, f"`{text}` at {script.name}:{node.lineno}"))
    return reaches


def _path_literals(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """String literals that may be paths: whole ones, and the constant head of `os.path.join("..", "..", x)`."""
    joined, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("path.join"):
            head = []
            for arg in node.args:
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    break
                head.append(arg.value)
            joined.update(id(arg) for arg in node.args)
            if head:
                found.append((node, "/".join(head)))
    found += [(node, node.value) for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in joined]
    return found


def _reached(cwd: Path, text: str) -> Path | None:
    """The folder above `cwd` that a relative path starting with `..` reaches (its `..` parts, and the
    plain name after them), or None."""
    if not text.startswith("..") or any(c.isspace() for c in text):
        return None
    parts = text.replace("\\", "/").split("/")
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    if not ups:
        return None
    folder = cwd.joinpath(*[os.pardir] * ups)
    following = parts[ups] if ups < len(parts) else ""
    if following and not any(c in following for c in "%{}*"):
        folder = folder / following
    return Path(os.path.normpath(folder))
