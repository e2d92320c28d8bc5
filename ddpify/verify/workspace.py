"""Where verify runs each side: a private copy of the user's working directory.

Scripts read relative paths (`traindata.pt`, `data/`, `configs/x.yaml`) and write relative or
`__file__`-relative ones (`checkpoints/`, `runs/`). Each side runs in a mirror of the directory
verify was started from: the same folders, small files copied, large ones linked (data), so what
the script reads is there and what it writes never lands in the user's tree.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

COPY_LIMIT_BYTES = 8 * 1024 * 1024  # larger files are linked, not copied
COPY_BUDGET_BYTES = 256 * 1024 * 1024  # past this, every further file is linked
MAX_ENTRIES = 20_000  # past this, the rest of the tree is linked at its top folder
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", "node_modules",
                          ".mypy_cache", ".pytest_cache", ".tox", ".ipynb_checkpoints"})


@dataclass
class Mirror:
    """What a mirror holds: its root and the files it only links (an overwrite would reach the user's)."""

    root: Path
    linked: list[str] = field(default_factory=list)
    copied_bytes: int = 0
    entries: int = 0

    def note(self) -> str | None:
        if not self.linked:
            return None
        shown = ", ".join(self.linked[:3]) + (", ..." if len(self.linked) > 3 else "")
        return (f"{len(self.linked)} large or numerous files are linked into the run directory, not copied ({shown}): "
                f"a script that overwrites them in place would change the originals")


def mirror(source: Path, target: Path, outside: Path, first: Path | None = None) -> Mirror:
    """Recreate `source` under `target`: folders made, small files copied, large ones symlinked.
    `outside` (verify's own workspace) is never entered, should it lie inside `source`; the folders
    leading to `first` (the working directory, where the runs write) are mirrored before any other,
    so they are recreated before the tree's other entries count towards MAX_ENTRIES."""
    result = Mirror(target)
    target.mkdir(parents=True, exist_ok=True)
    inside = relative_inside(first, source) if first is not None else None
    _mirror_dir(source, target, result, outside.resolve(), inside.parts if inside else ())
    return result


def _mirror_dir(source: Path, target: Path, result: Mirror, outside: Path, toward: tuple[str, ...]) -> None:
    """Mirror one folder, the entry named `toward[0]` (on the way to the working directory) first."""
    try:
        entries = sorted(os.scandir(source), key=lambda e: (toward[:1] != (e.name,), e.name))
    except OSError:
        return
    for entry in entries:
        result.entries += 1
        destination = target / entry.name
        if entry.is_dir(follow_symlinks=False):
            if entry.name in SKIPPED_DIRS or Path(entry.path).resolve() == outside:
                continue
            if result.entries > MAX_ENTRIES:
                _link(Path(entry.path), destination, result)
            else:
                destination.mkdir()
                _mirror_dir(Path(entry.path), destination, result, outside, toward[1:] if toward[:1] == (entry.name,) else ())
        elif entry.is_symlink() or entry.is_file():
            _place_file(entry, destination, result)


def _place_file(entry: os.DirEntry, destination: Path, result: Mirror) -> None:
    try:
        size = entry.stat().st_size
    except OSError:
        return  # a dangling link: nothing to read there either
    if size <= COPY_LIMIT_BYTES and result.copied_bytes + size <= COPY_BUDGET_BYTES and result.entries <= MAX_ENTRIES:
        try:
            shutil.copy2(entry.path, destination)
            result.copied_bytes += size
            return
        except OSError:
            pass  # unreadable: link it, and the script meets the same error it would meet at home
    _link(Path(entry.path), destination, result)


def _link(source: Path, destination: Path, result: Mirror) -> None:
    destination.symlink_to(source.resolve())
    result.linked.append(str(source))


def relative_inside(path: Path, root: Path) -> Path | None:
    """`path` relative to `root` when it lies inside it, else None."""
    try:
        return path.resolve().relative_to(root.resolve())
    except ValueError:
        return None
