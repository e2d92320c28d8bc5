"""Recreate the public corpus (build/) from repository snapshots: nothing fetched is committed.

For every manifest entry missing from build/ (or all with --force): `git archive` the entry's folder
at the manifest's commit out of the repository's snapshot, drop the excluded paths, then write the
made-up data the entry needs (`make`). Snapshots are bare git directories, looked up under
DDPIFY_CORPUS_MIRRORS (default /work/.mirror; one folder per repository, named owner+name, holding
the git directory as repo/ or repo/.git). Bring a missing one with the agent's `fetch` tool, or
`git clone --bare https://github.com/OWNER/NAME DIR/OWNER+NAME/repo` where the network allows.

    python bench/public_corpus/rebuild.py [--only NAME ...] [--force]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
BUILD = HERE / "build"
MIRRORS = Path(os.environ.get("DDPIFY_CORPUS_MIRRORS", "/work/.mirror"))
# a made-up vocabulary: short pronounceable words, so word-level language models get a few hundred types
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "po", "si", "de", "vu", "ba", "ge"]


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def git_dir(repo: str) -> Path:
    base = MIRRORS / repo.replace("/", "+") / "repo"
    for candidate in (base / ".git", base):
        if (candidate / "HEAD").is_file():
            return candidate
    raise SystemExit(f"no snapshot of {repo} under {MIRRORS} (fetch github:{repo} first)")


def extract(repo: str, commit: str, folder: str, target: Path, exclude: list) -> list:
    """The repository's `folder` at `commit`, its contents laid directly in `target`, less the paths in
    `exclude`; returns the files the snapshot lacks (large files a snapshot may list but not hold)."""
    git = ["git", "--git-dir", str(git_dir(repo))]
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", commit, *([folder] if folder else [])],
                             check=True, capture_output=True).stdout.decode().split("\0")
    prefix = f"{folder.rstrip('/')}/" if folder else ""
    missing = []
    for row in filter(None, listing):
        info, path = row.split("\t", 1)
        mode, kind, blob = info.split()
        relative = path[len(prefix):]
        if kind != "blob" or mode == "120000" or any(relative == x or relative.startswith(x.rstrip("/") + "/") for x in exclude):
            continue
        content = subprocess.run([*git, "cat-file", "blob", blob], capture_output=True)
        if content.returncode != 0:
            missing.append(relative)
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(content.stdout)
        if mode == "100755":
            destination.chmod(0o755)
    return missing


def words(count: int, seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    lines, line = [], []
    for _ in range(count):
        line.append(rng.choice(vocabulary))
        if len(line) >= rng.randint(8, 20):
            lines.append(" " + " ".join(line) + " ")
            line = []
    return "\n".join(lines) + "\n"


def chars(count: int, seed: int) -> str:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ      ,.!?;:'-\n"  # every character of chargpt's sampling prompt
    return "".join(rng.choice(alphabet) for _ in range(count))


def nanogpt_char(folder: Path) -> None:
    """train.bin / val.bin (uint16 token ids) and meta.pkl, as nanoGPT's shakespeare_char/prepare.py writes them."""
    import numpy as np

    text = chars(60_000, 7)
    vocabulary = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocabulary)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    cut = int(len(ids) * 0.9)
    folder.mkdir(parents=True, exist_ok=True)
    ids[:cut].tofile(folder / "train.bin")
    ids[cut:].tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(vocabulary), "itos": dict(enumerate(vocabulary)), "stoi": stoi}, f)


def images(folder: Path, step: dict, seed: int) -> None:
    """step["count"] seeded random images of step["size"] (width, height) in `folder`, named
    0000{tail}.{suffix}, ...: RGB, or with "mask" two-valued (0/255) greyscale segmentation masks."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    width, height = step["size"]
    for index in range(step["count"]):
        if step.get("mask"):
            image = Image.fromarray((rng.random((height, width)) < 0.5).astype(np.uint8) * 255, mode="L")
        else:
            image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        image.save(folder / f"{index:04d}{step.get('tail', '')}.{step.get('suffix', 'jpg')}")


def make(step: dict, target: Path, seed: int) -> None:
    if "dir" in step:
        (target / step["dir"]).mkdir(parents=True, exist_ok=True)
    elif "words" in step or "chars" in step:
        path = target / (step.get("words") or step["chars"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(words(step["count"], seed) if "words" in step else chars(step["count"], seed))
    elif "images" in step:
        images(target / step["images"], step, seed)
    elif "nanogpt_char" in step:
        nanogpt_char(target / step["nanogpt_char"])
    elif "cora" in step:  # the made-up Cora the shim serves for cora.tgz downloads, unpacked
        sys.path.insert(0, str(HERE / "shims"))
        from ddpify_corpus_site import fake_cora

        with tarfile.open(fileobj=io.BytesIO(fake_cora()), mode="r:gz") as archive:
            for member in archive.getmembers():
                path = target / step["cora"] / Path(member.name).name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(archive.extractfile(member).read())
    elif "run" in step:  # a data-making script of the entry itself, run in the copy
        subprocess.run([sys.executable, *step["run"]], cwd=target, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    else:
        raise ValueError(f"unknown make step {step}")


def build(entry: dict, commits: dict, force: bool = False) -> Path:
    """build/NAME for one entry; kept when already there (unless force)."""
    target = BUILD / entry["name"]
    if target.is_dir() and not force and (target / ".built").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    missing = extract(entry["repo"], commits[entry["repo"]], entry.get("folder", ""), target, entry.get("exclude", []))
    if missing:
        print(f"{entry['name']}: not in the snapshot, left out: {', '.join(missing)}", file=sys.stderr)
    for index, step in enumerate(entry.get("make", [])):
        make(step, target, index)
    if not (target / entry["script"]).is_file():
        raise SystemExit(f"{entry['name']}: {entry['script']} is not in {entry['repo']}@{commits[entry['repo']][:10]}:{entry.get('folder', '')}")
    (target / ".built").write_text(commits[entry["repo"]] + "\n")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME")
    parser.add_argument("--force", action="store_true", help="rebuild entries already in build/")
    options = parser.parse_args()
    data = manifest()
    for entry in data["entries"]:
        if options.only and entry["name"] not in options.only:
            continue
        print(f"{entry['name']}: {build(entry, data['repos'], options.force)}")


if __name__ == "__main__":
    main()
