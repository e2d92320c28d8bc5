"""Downloads written by hand (URL reads written to a file, archive extractions) run once per node.

The scripts below fetch an archive from a local file:// URL (no network) under an `if` that checks
whether its files exist, as pytorch/examples' GAT does with `requests.get` and `tarfile`. Every rank
of the unconverted script takes the download branch at once; converted, local rank 0 downloads while
the other rank waits outside the `if`, then finds the files and skips it.
"""

from __future__ import annotations

import ast
import io
import sys
import tarfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.distributed.launch import download_unit, downloads
from ddpify.convert import convert_source

try:
    from helpers import run_script
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import run_script

FETCH_IMPORTS = """
    import os
    import sys
    import tarfile
    import time
    import urllib.request
"""
FETCH = """

    def fetch(root):
        if not os.path.isfile(os.path.join(root, "rows.txt")):
            with open(os.path.join(root, "fetches.log"), "a") as log:
                log.write(f"{os.getpid()}\\n")
            time.sleep(0.3)  # a slow network: a rank that checks meanwhile finds no files either
            with urllib.request.urlopen(sys.argv[1]) as response, open(os.path.join(root, "rows.tgz"), "wb") as out:
                out.write(response.read())
            with tarfile.open(os.path.join(root, "rows.tgz")) as archive:
                archive.extractall(root)
"""
MAIN = """

    def main():
        os.makedirs("data", exist_ok=True)
        fetch("data")
        rows = torch.tensor([[float(v) for v in line.split()] for line in open("data/rows.txt")])
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            optimizer.zero_grad()
            loss = (model(rows[:, :2]) - rows[:, 2:]).pow(2).mean()
            loss.backward()
            optimizer.step()
        print("rows", len(rows))


    if __name__ == "__main__":
        main()
"""
FETCH_IN_A_FUNCTION = FETCH_IMPORTS + "\n    import torch\n" + FETCH + MAIN
# the same as a project: the download in a module the entry imports (converted with the entry)
FETCH_IN_AN_IMPORTED_MODULE = {
    "downloads.py": FETCH_IMPORTS + FETCH,
    "train.py": "\n    import os\n\n    import torch\n\n    from downloads import fetch\n" + MAIN,
}

FETCH_AT_MODULE_LEVEL = """
    import os
    import shutil
    import sys
    import time
    import urllib.request

    import torch

    if __name__ == "__main__":
        os.makedirs("data", exist_ok=True)
        if os.path.exists("data/rows.txt"):
            print("rows already there")
        else:
            with open("data/fetches.log", "a") as log:
                log.write(f"{os.getpid()}\\n")
            time.sleep(0.3)  # a slow network: a rank that checks meanwhile finds no files either
            urllib.request.urlretrieve(sys.argv[1], "data/rows.tgz")
            shutil.unpack_archive("data/rows.tgz", "data")
        rows = torch.tensor([[float(v) for v in line.split()] for line in open("data/rows.txt")])
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            optimizer.zero_grad()
            loss = (model(rows[:, :2]) - rows[:, 2:]).pow(2).mean()
            loss.backward()
            optimizer.step()
        print("rows", len(rows))
"""


def converted_project(folder: Path, sources: dict[str, str], target: str) -> dict[str, str]:
    """The files of a project (its entry train.py) as `convert` leaves them, converted in `folder`."""
    from ddpify.project_conversion import convert_entry

    folder.mkdir()
    for name, source in sources.items():
        (folder / name).write_text(textwrap.dedent(source))
    conversion = convert_entry(folder / "train.py", target, {})
    assert not conversion.entry_incomplete and not [job.error for job in conversion.jobs if job.error]
    return {job.path.name: job.result.output for job in conversion.jobs}  # type: ignore[union-attr]


def _archive(path: Path) -> str:
    """A .tgz holding rows.txt (8 rows of x1 x2 y); its file:// URL."""
    text = "".join(f"{i} {i + 1} {2 * i}\n" for i in range(8)).encode()
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("rows.txt")
        info.size = len(text)
        archive.addfile(info, io.BytesIO(text))
    return path.resolve().as_uri()


@pytest.mark.parametrize("source", [FETCH_IN_A_FUNCTION, FETCH_AT_MODULE_LEVEL], ids=["function", "module"])
def test_on_two_ranks_one_rank_downloads_and_both_read_the_files(tmp_path: Path, source: str):
    url = _archive(tmp_path / "served.tgz")
    (tmp_path / "train.py").write_text(convert_source(textwrap.dedent(source), "ddp").output)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", url]
    done = run_script(torchrun, tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fetches = (tmp_path / "data" / "fetches.log").read_text().split()
    assert len(fetches) == 1, f"{len(fetches)} ranks downloaded"


@pytest.mark.parametrize("disks", ["own", "shared"])
@pytest.mark.parametrize("target", ["ddp", "accelerate"])
@pytest.mark.parametrize("sources", [{"train.py": FETCH_IN_A_FUNCTION}, {"train.py": FETCH_AT_MODULE_LEVEL}, FETCH_IN_AN_IMPORTED_MODULE],
                         ids=["function", "module", "imported-module"])
def test_on_two_nodes_the_files_are_downloaded_once_on_each_disk(tmp_path: Path, sources: dict[str, str], target: str, disks: str):
    """Two nodes of two ranks, each node in a folder of its own (its local disk), or both in one (a shared
    filesystem). Each disk gets one whole download: a node with a disk of its own downloads for itself (a
    download's writes put under `if RANK == 0:` left it a half-made download, and it crashed reading the
    archive; under Accelerate, with no barrier, the first node's second process did too), and nodes sharing
    a disk must not download into the same files at once (each node's local rank 0 did, side by side)."""
    from ddpify.verify.rendezvous import client_environment, serve_store  # imports torch

    url = _archive(tmp_path / "served.tgz")
    files = converted_project(tmp_path / "project", sources, target)
    nodes = [tmp_path / f"node{node}" for node in range(2)] if disks == "own" else [tmp_path / "shared"] * 2
    for disk in set(nodes):
        disk.mkdir()
        for name, text in files.items():
            (disk / name).write_text(text)
    store = serve_store(4)
    ranks = [{"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
              "GROUP_RANK": str(rank // 2), **client_environment(store)} for rank in range(4)]
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda env: run_script([sys.executable, "train.py", url], nodes[int(env["GROUP_RANK"])],
                                                    env_extra=env, timeout=60), ranks))
    assert [run.returncode for run in runs] == [0] * 4, "\n".join(run.stderr[-2000:] for run in runs)
    assert {disk.name: len((disk / "data" / "fetches.log").read_text().split()) for disk in nodes} == {disk.name: 1 for disk in nodes}


def test_the_barriers_go_around_the_if_that_checks_for_the_files():
    """Inside the `if`, a barrier would be met only by the ranks that found no files."""
    lines = convert_source(textwrap.dedent(FETCH_IN_A_FUNCTION), "ddp").output.splitlines()
    test = lines.index('    if not os.path.isfile(os.path.join(root, "rows.txt")):')
    assert lines[test - 4:test] == ["    if RANK != 0:", "        dist.barrier()  # rank 0 downloads first",
                                    "    if LOCAL_RANK != 0:", "        dist.barrier()  # then each node's local rank 0 (its own disk)"]
    assert sum("dist.barrier()" in line for line in lines) == 4


@pytest.mark.parametrize(("code", "expected"), [
    ("with requests.get(url) as r, open('a.zip', 'wb') as f:\n    f.write(r.content)\n", True),
    ("if not os.path.exists('a.zip'):\n    r = requests.get(url)\n    open('a.zip', 'wb').write(r.content)\n", True),
    ("labels = requests.get(url).json()\n", False),
    ("with open('a.json') as f:\n    labels = requests.get(f.read()).json()\n", False),
    ("zipfile.ZipFile('a.zip').extractall('data')\n", True),
])
def test_a_url_read_is_a_download_where_its_statement_writes_a_file(code: str, expected: bool):
    anatomy = analyze("import os\nimport zipfile\nimport requests\nurl = 'https://example.org/a.zip'\n" + code)
    assert bool(downloads(anatomy)) is expected


@pytest.mark.parametrize(("code", "runs_once_per_node"), [
    ("if not os.path.exists('data'):\n    zipfile.ZipFile('a.zip').extractall('data')\n", "if not os.path.exists('data'):"),
    ("with zipfile.ZipFile('a.zip') as z:\n    z.extractall('data')\n", "with zipfile.ZipFile('a.zip') as z:"),
    # a model built, or a function of the script called, under the test: local rank 0 alone may train
    ("if not os.path.exists('model.pt'):\n    zipfile.ZipFile('a.zip').extractall('data')\n    model = torch.nn.Linear(2, 1)\n",
     "zipfile.ZipFile('a.zip').extractall('data')"),
    ("def train():\n    pass\nif not os.path.isdir('data'):\n    zipfile.ZipFile('a.zip').extractall('data')\n    train()\n",
     "zipfile.ZipFile('a.zip').extractall('data')"),
])
def test_the_statement_run_once_per_node_takes_the_existence_test_but_no_training(code: str, runs_once_per_node: str):
    anatomy = analyze("import os\nimport zipfile\nimport torch\n" + code)
    (download,) = downloads(anatomy)
    assert ast.unparse(download_unit(anatomy, download.stmt)).splitlines()[0] == runs_once_per_node
