"""Recreate the lint corpus (build/NAME.py) from repository snapshots: nothing fetched is committed.

Each manifest entry is one script, written to build/NAME.py from the snapshot of its repository at
the manifest's commit (`git cat-file`). Snapshots are found as the public corpus finds them
(bench/public_corpus/rebuild.py's `git_dir`: DDPIFY_CORPUS_MIRRORS, default /work/.mirror, one folder
per repository named owner+name); bring a missing one with the agent's `fetch` tool or a bare clone.

    python bench/lint_corpus/rebuild.py [--only NAME ...] [--force]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
BUILD = HERE / "build"


def _public_corpus_rebuild():
    """bench/public_corpus/rebuild.py as a module (its snapshot lookup is reused, not copied)."""
    spec = importlib.util.spec_from_file_location("public_corpus_rebuild", HERE.parent / "public_corpus" / "rebuild.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def build(entry: dict, commit: str, git_dir, force: bool = False) -> Path:
    """build/NAME.py for one entry; kept when already there (unless force)."""
    target = BUILD / f"{entry['name']}.py"
    if target.is_file() and not force:
        return target
    blob = subprocess.run(["git", "--git-dir", str(git_dir(entry["repo"])), "cat-file", "blob", f"{commit}:{entry['path']}"],
                          check=True, capture_output=True).stdout
    BUILD.mkdir(exist_ok=True)
    target.write_bytes(blob)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME")
    parser.add_argument("--force", action="store_true", help="rewrite entries already in build/")
    options = parser.parse_args()
    data = manifest()
    git_dir = _public_corpus_rebuild().git_dir
    for entry in data["entries"]:
        if not options.only or entry["name"] in options.only:
            print(f"{entry['name']}: {build(entry, data['repos'][entry['repo']]['commit'], git_dir, options.force)}")


if __name__ == "__main__":
    main()
