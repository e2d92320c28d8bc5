"""Where an entry script's imports may be found beyond its own directory.

A script in `projects/demo/demo.py` that imports `mypkg` two levels up finds it because it adds that
directory to `sys.path` (`sys.path.append(os.path.join(os.path.dirname(__file__), "..", ".."))`,
`sys.path.insert(0, str(Path(__file__).resolve().parents[2]))`) or because the user runs it from the
repository root (or installed the repository with `pip install -e .`). These directories are searched
after the entry's own; each is spelled from the entry's directory (`projects/demo/../..`).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

_REPOSITORY_MARKERS = (".git", "setup.py", "setup.cfg", "pyproject.toml")
_SAME_PATH = frozenset({"os.path.abspath", "os.path.realpath", "os.path.normpath", "str", "Path", "pathlib.Path", "os.fspath"})
_PATH_METHODS = frozenset({"resolve", "absolute"})


def extra_roots(entry: Path, tree: ast.Module) -> list[Path]:
    """The directories, enclosing the entry's, that its `sys.path` edits add, then the repository root."""
    roots = added_paths(entry, tree)
    repository = repository_root(entry)
    found = [*roots, *([repository] if repository is not None else [])]
    return [p for i, p in enumerate(found) if _encloses(p, entry.parent) and p not in found[:i]]


def added_paths(entry: Path, tree: ast.Module) -> list[Path]:
    """The directories the entry's `sys.path.append(p)` / `sys.path.insert(i, p)` calls add, where they can be read."""
    return [p for p in (_path_value(arg, entry) for arg in _sys_path_additions(tree)) if p is not None]


def repository_root(entry: Path) -> Path | None:
    """The nearest directory above the entry's that holds `.git`, `setup.py`, `setup.cfg` or `pyproject.toml`."""
    here, levels = entry.parent.resolve(), 0
    while here.parent != here:
        here, levels = here.parent, levels + 1
        if any((here / marker).exists() for marker in _REPOSITORY_MARKERS):
            return Path(os.path.normpath(entry.parent.joinpath(*[os.pardir] * levels)))
    return None


def installed(top_level: str) -> bool:
    """Can the interpreter import the top-level module `top_level` (site-packages, an editable install)?"""
    return _spec(top_level) is not None


def editable_root(top_level: str, entry: Path) -> Path | None:
    """The directory holding `top_level` where it is installed in place (`pip install -e .`, PYTHONPATH)
    from a directory that encloses the entry's: the project's own code, to be followed."""
    spec = _spec(top_level)
    origin = spec.origin if spec is not None and spec.has_location else None
    if origin is None or any(part in ("site-packages", "dist-packages") for part in Path(origin).parts):
        return None
    package = Path(origin).parent if Path(origin).name == "__init__.py" else Path(origin)
    holder = package.parent
    if not _encloses(holder, entry.parent):
        return None
    return Path(os.path.normpath(entry.parent / os.path.relpath(holder, entry.parent.resolve())))


def _spec(top_level: str):
    """The interpreter's spec for `top_level`, the implicit current directory left out (a script run
    as `python path/to/train.py` does not import from it)."""
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if p not in ("", os.curdir)]
    try:
        return importlib.util.find_spec(top_level)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved


def _sys_path_additions(tree: ast.Module) -> list[ast.expr]:
    """The paths of `sys.path.append(p)` and `sys.path.insert(i, p)` calls."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) == "sys.path":
            if node.func.attr == "append" and len(node.args) == 1:
                found.append(node.args[0])
            elif node.func.attr == "insert" and len(node.args) == 2:
                found.append(node.args[1])
    return found


def _path_value(expr: ast.expr, entry: Path) -> Path | None:
    """The directory `expr` names, spelled from the entry's directory; None where it can't be read."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return Path(os.path.normpath(entry.parent / expr.value))
    if isinstance(expr, ast.Name) and expr.id == "__file__":
        return entry
    if isinstance(expr, ast.Attribute) and expr.attr == "parent":
        return _parent(_path_value(expr.value, entry), 1)
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute) and expr.value.attr == "parents":
        index = expr.slice
        inner = _path_value(expr.value.value, entry)
        return _parent(inner, index.value + 1) if isinstance(index, ast.Constant) and isinstance(index.value, int) else None
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        return _joined(_path_value(expr.left, entry), [expr.right])
    if isinstance(expr, ast.Call):
        return _call_value(expr, entry)
    return None


def _call_value(call: ast.Call, entry: Path) -> Path | None:
    name = ast.unparse(call.func)
    if isinstance(call.func, ast.Attribute) and call.func.attr in _PATH_METHODS and not call.args:
        return _path_value(call.func.value, entry)
    if not call.args:
        return None
    if name in _SAME_PATH:
        return _path_value(call.args[0], entry)
    if name == "os.path.dirname":
        return _parent(_path_value(call.args[0], entry), 1)
    if name == "os.path.join":
        return _joined(_path_value(call.args[0], entry), call.args[1:])
    return None


def _joined(base: Path | None, parts: list[ast.expr]) -> Path | None:
    if base is None or not all(isinstance(p, ast.Constant) and isinstance(p.value, str) for p in parts):
        return None
    return Path(os.path.normpath(base.joinpath(*[p.value for p in parts])))  # type: ignore[attr-defined]


def _parent(path: Path | None, levels: int) -> Path | None:
    return None if path is None else Path(os.path.normpath(path.joinpath(*[os.pardir] * levels)))


def _encloses(directory: Path, inner: Path) -> bool:
    outer, inner_resolved = directory.resolve(), inner.resolve()
    return outer == inner_resolved or outer in inner_resolved.parents
