"""Which folder `ddpify verify` mirrors for each side: the working directory, or the project root above it
that the script's relative paths, its arguments, PYTHONPATH or its `sys.path` edits reach (or --root).

The end-to-end tests run verify (2 ranks, gloo, CPU, bounded by a timeout) on small projects laid out as
public ones are: a script run from `implementations/gan/` that reads `../../data/`, and one run from
`tool/` that imports its package through PYTHONPATH. Each checks that nothing lands in the user's tree.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify  # noqa: E402
from test_verify import PACKAGE_TRAINER  # noqa: E402

from ddpify.verify import workspace  # noqa: E402
from ddpify.verify.project_root import given_root, project_root  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT_S = 240

DATA_ABOVE = """
import os
import torch
from torch.utils.data import DataLoader, TensorDataset

x, y = torch.load("../../data/points/points.pt")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
os.makedirs("../../outputs", exist_ok=True)
torch.save(model.state_dict(), "../../outputs/model.pt")
"""


def files_of(folder: Path) -> list[Path]:
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


def verify_in(cwd: Path, *args: str, pythonpath: str = "") -> tuple[int, dict]:
    """`ddpify verify --json ARGS` run from `cwd`, ddpify importable, `pythonpath` first on PYTHONPATH (forked: the
    fork server gives the process and verify's launcher the sys.path a fresh interpreter has)."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [pythonpath, str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = run_ddpify(["verify", "--json", *args], cwd, env, SUBPROCESS_TIMEOUT_S)
    assert completed.stdout.startswith("{"), completed.stderr[-3000:]
    return completed.returncode, json.loads(completed.stdout)


def gan_zoo_layout(top: Path) -> Path:
    """`implementations/gan/train.py` reading `../../data/points/points.pt`; the folder it runs from."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    (top / "data" / "points").mkdir(parents=True)
    torch.save((torch.randn(32, 4, generator=generator), torch.randn(32, 1, generator=generator)), top / "data" / "points" / "points.pt")
    work = top / "implementations" / "gan"
    work.mkdir(parents=True)
    (work / "train.py").write_text(DATA_ABOVE)
    return work


def package_layout(top: Path) -> Path:
    """pygcn's layout: the package `tinypkg/` at the top (a training module the converter changes) and
    the entry `tool/run.py`, run from `tool/` with the top on PYTHONPATH; the folder it runs from."""
    (top / "tinypkg").mkdir(parents=True)
    (top / "tinypkg" / "__init__.py").write_text("")
    (top / "tinypkg" / "trainer.py").write_text(PACKAGE_TRAINER)
    (top / "tool").mkdir()
    (top / "tool" / "run.py").write_text("import torch\n\nfrom tinypkg.trainer import train\n\ntorch.manual_seed(0)\ntrain()\n")
    return top / "tool"


def test_data_read_above_the_working_directory_is_found_and_nothing_is_written_there(tmp_path):
    top = tmp_path / "repo"
    work = gan_zoo_layout(top)
    before = files_of(tmp_path)
    code, result = verify_in(work, "train.py", "--to", "ddp", "--steps", "4")
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]
    mirrored = next(note for note in result["notes"] if note.startswith("each side runs in a mirror of"))
    assert mirrored.startswith(f"each side runs in a mirror of {top.resolve()} (`../../data/points/points.pt` at train.py:6; ")
    assert mirrored.endswith("`../../outputs/model.pt` at train.py:17), in its implementations/gan")
    assert files_of(tmp_path) == before, "verify wrote into the user's tree"


def test_a_package_found_through_a_relative_pythonpath_above_the_working_directory(tmp_path):
    """`PYTHONPATH=.. python run.py` from `tool/`: the package is each side's own (the candidate's converted)."""
    work = package_layout(tmp_path / "repo")
    before = files_of(tmp_path)
    code, result = verify_in(work, "run.py", "--to", "ddp", pythonpath="..")
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]
    assert any(note.startswith(f"each side runs in a mirror of {(tmp_path / 'repo').resolve()} (PYTHONPATH=..)") for note in result["notes"])
    assert files_of(tmp_path) == before, "verify wrote into the user's tree"


def test_an_absolute_pythonpath_inside_the_mirrored_folder_leads_into_each_sides_mirror(tmp_path):
    """With the package's folder on PYTHONPATH as an absolute path, the candidate imports its converted
    copy of the trainer, not the user's original (which would train as one process: not converted)."""
    top = tmp_path / "repo"
    package_layout(top)
    code, result = verify_in(top, "tool/run.py", "--to", "ddp", pythonpath=str(top))
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]


def test_root_names_the_folder_to_mirror(tmp_path):
    """A path the analysis cannot read (built from a variable) is found when --root names the folder."""
    top = tmp_path / "repo"
    work = gan_zoo_layout(top)
    (work / "train.py").write_text(DATA_ABOVE.replace('"../../', 'UP + "/" + UP + "/').replace("import os\n", "import os\nUP = '.' + '.'\n"))
    code, result = verify_in(work, "train.py", "--to", "ddp", "--steps", "2")
    assert (code, result["verdict"]) == (2, "error") and "points.pt" in result["message"], result["message"]
    code, result = verify_in(work, "train.py", "--to", "ddp", "--steps", "2", "--root", "../..")
    assert (code, result["verdict"]) == (0, "equivalent"), result["message"]
    assert any(f"mirror of {top.resolve()} (--root)" in note for note in result["notes"])


def test_a_root_that_does_not_hold_the_working_directory_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "train.py").write_text("print('never run')\n")
    completed = run_ddpify(["verify", "train.py", "--to", "ddp", "--root", "../b"], tmp_path / "a", {}, 60)
    assert completed.returncode == 2 and "does not enclose the working directory" in completed.stderr, completed.stderr


def test_reaches_of_literals_joins_arguments_pythonpath_and_sys_path_edits(tmp_path):
    cwd = tmp_path / "top" / "a" / "b"
    cwd.mkdir(parents=True)
    script = cwd / "train.py"
    script.write_text('import os, sys\nopen("../x.txt")\nos.path.join(os.path.dirname(__file__), "..", "..", "..")\n')
    assert project_root(cwd, [script], ["train.py"], "").folder == cwd.parent.resolve()
    script.write_text('import os\nos.path.join("..", "..", "data")\n')
    assert project_root(cwd, [script], ["train.py"], "").folder == (tmp_path / "top").resolve()
    script.write_text("print('reads nothing above')\n")
    assert project_root(cwd, [script], ["train.py"], "").folder == cwd.resolve()
    assert project_root(cwd, [script], ["train.py", "--data=../../d"], "").folder == (tmp_path / "top").resolve()
    assert project_root(cwd, [script], ["train.py"], f"src{os.pathsep}..").folder == cwd.parent.resolve()
    script.write_text("import sys\nfrom pathlib import Path\nsys.path.insert(0, str(Path(__file__).resolve().parents[2]))\n")
    assert project_root(cwd, [script], ["train.py"], "").folder == (tmp_path / "top").resolve()


def test_a_reach_up_to_the_top_of_the_filesystem_or_the_temp_directory_is_not_mirrored_on_its_own(tmp_path):
    cwd = tmp_path / "a"
    cwd.mkdir()
    script = cwd / "train.py"
    script.write_text('open("' + "../" * len(cwd.resolve().parts) + 'data/x")\n')
    root = project_root(cwd, [script], ["train.py"], "")
    assert root.folder == cwd.resolve()
    assert "verify does not mirror / on its own (a folder at the top of the filesystem)" in root.note
    assert "pass --root" in root.note
    temp = Path(tempfile.gettempdir()).resolve()
    if not cwd.resolve().is_relative_to(temp):
        pytest.skip("the tests' folders are not in the temp directory")
    script.write_text('open("' + "../" * (len(cwd.resolve().parts) - len(temp.parts)) + 'data/x")\n')
    root = project_root(cwd, [script], ["train.py"], "")
    assert root.folder == cwd.resolve() and f"does not mirror {temp} on its own (the temp directory)" in root.note


def test_given_root_must_enclose_the_working_directory(tmp_path):
    (tmp_path / "a").mkdir()
    assert given_root(str(tmp_path), tmp_path / "a").folder == tmp_path.resolve()
    with pytest.raises(ValueError, match="does not enclose"):
        given_root(str(tmp_path / "a"), tmp_path)


def test_the_folders_leading_to_the_working_directory_are_recreated_before_the_entry_limit(tmp_path, monkeypatch):
    """A tree past MAX_ENTRIES is linked at its top folders; the working directory's folders never are
    (the runs write there), whatever their names sort after."""
    monkeypatch.setattr(workspace, "MAX_ENTRIES", 5)
    source = tmp_path / "user"
    for name in "abcdefgh":
        (source / name).mkdir(parents=True)
        (source / name / "f.txt").write_text(name)
    (source / "zz" / "work").mkdir(parents=True)
    result = workspace.mirror(source, tmp_path / "mirror", outside=tmp_path / "elsewhere", first=source / "zz" / "work")
    work = tmp_path / "mirror" / "zz" / "work"
    assert work.is_dir() and not work.is_symlink() and not work.parent.is_symlink()
    assert result.linked, "the rest of the tree is linked past the limit"
