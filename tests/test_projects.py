"""Projects, not files: `convert` follows an entry script's local imports (fixtures/projects/<name>/).

Snapshots of every converted file (fixtures/expected/projects/<name>/, regenerate with
DDPIFY_UPDATE_SNAPSHOTS=1), what each file learns from the others, the output layout, and execution:
every converted project runs under torchrun on 2 ranks, logs once, and `ddpify verify` finds it
equivalent to the original.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.codemods.pipeline import ConversionResult
from ddpify.project_conversion import convert_entry

try:
    from helpers import failure_report, run_ddpify, run_script, written_files
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import failure_report, run_ddpify, run_script, written_files

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = ROOT / "fixtures" / "projects"
EXPECTED = ROOT / "fixtures" / "expected" / "projects"
ENTRIES = {"classic": "train.py", "trainer_package": "main.py", "optimizer_helper": "run.py", "work_in_fstrings": "train.py",
           "rank_zero_writers": "train.py"}
# the modules each conversion must change besides the entry (the others are copied unchanged)
CHANGED_MODULES = {
    "classic": {"data.py", "utils.py"},  # model.py trains nothing: left as it is
    "trainer_package": {"trainer/core.py"},
    "optimizer_helper": {"helpers.py"},
    "work_in_fstrings": {"engine.py"},  # its prints go on rank 0; train.py computes engine's work on every rank first
    "rank_zero_writers": {"wandb.py"},  # the local wandb stand-in writes its summary on rank 0
}
SETUP_CALL = re.compile(r"^\s*setup_distributed\(\)", re.M)


def invoke(*args):
    return CliRunner().invoke(cli, ["convert", *map(str, args)], catch_exceptions=False)


def copy_project(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(PROJECTS / name, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def python_files(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): p.read_text() for p in sorted(directory.rglob("*.py")) if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory) -> dict[str, Path]:
    """Each project converted with the default layout: <project>_ddp/ beside it."""
    base = tmp_path_factory.mktemp("projects")
    out = {}
    for name, entry in ENTRIES.items():
        project = copy_project(base, name)
        result = invoke(project / entry, "--to", "ddp")
        assert result.exit_code == 0, result.output
        out[name] = base / f"{name}_ddp"
    return out


# ===== snapshots and layout =====================================================================
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_snapshot(name: str, mirrors):
    original, converted = python_files(PROJECTS / name), python_files(mirrors[name])
    assert set(converted) == set(original), "the mirror holds every module of the project"
    changed = {path: text for path, text in converted.items() if text != original[path]}
    assert set(changed) == {ENTRIES[name], *CHANGED_MODULES[name]}
    if os.environ.get("DDPIFY_UPDATE_SNAPSHOTS") == "1":
        shutil.rmtree(EXPECTED / name, ignore_errors=True)
        for path, text in changed.items():
            (EXPECTED / name / path).parent.mkdir(parents=True, exist_ok=True)
            (EXPECTED / name / path).write_text(text)
    assert changed == python_files(EXPECTED / name)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_only_the_entry_joins_the_process_group(name: str, mirrors):
    for path, text in python_files(mirrors[name]).items():
        joins = bool(SETUP_CALL.search(text)) or "def setup_distributed" in text
        assert joins == (path == ENTRIES[name]), f"{path}: only the entry script sets up the process group"


def test_the_user_files_are_untouched_and_the_report_names_every_file(tmp_path):
    project = copy_project(tmp_path, "classic")
    before = python_files(project)
    result = invoke(project / "train.py", "--to", "ddp")
    assert result.exit_code == 0, result.output
    assert python_files(project) == before
    mirror = tmp_path / "classic_ddp"
    assert re.findall(r"^wrote (.*)$", result.stdout, re.M) == [str(mirror / f) for f in ("train.py", "data.py", "utils.py")]
    assert (mirror / "model.py").read_text() == (project / "model.py").read_text()  # copied unchanged
    assert re.findall(r"^launch: .* (\S+)$", result.stdout, re.M) == [str(mirror / "train.py")], "only the entry is launched"
    assert f"{project / 'utils.py'}:" in result.stdout  # changes are reported against each file


def test_output_directory_in_place_diff_and_check(tmp_path):
    project = copy_project(tmp_path, "trainer_package")
    out = tmp_path / "out"
    assert invoke(project / "main.py", "--to", "ddp", "-o", out).exit_code == 0
    assert set(python_files(out)) == set(python_files(project))
    diff = invoke(project / "main.py", "--to", "ddp", "--diff")
    assert re.findall(r"^\+\+\+ b/(.*)$", diff.stdout, re.M) == [str(project / "main.py"), str(project / "trainer" / "core.py")]
    check = invoke(project / "main.py", "--to", "ddp", "--check")
    assert check.exit_code == 1
    assert re.findall(r"^would convert (.*)$", check.stdout, re.M) == [str(project / "main.py"), str(project / "trainer" / "core.py")]
    assert invoke(project / "main.py", "--to", "ddp", "--in-place").exit_code == 0
    assert python_files(project) == python_files(out)
    assert not list(project.rglob("*.ddpify-tmp"))


def test_several_files_never_go_to_stdout_or_over_the_project(tmp_path):
    project = copy_project(tmp_path, "optimizer_helper")
    for output in ("-", project):
        result = CliRunner().invoke(cli, ["convert", str(project / "run.py"), "--to", "ddp", "-o", str(output)])
        assert result.exit_code == 2, result.output
    assert python_files(project) == python_files(PROJECTS / "optimizer_helper")



def _planted_bug(text, target, path=None, **options):
    raise RuntimeError("a planted bug")


def _invalid_output(text, target, path=None, **options):
    return ConversionResult(text, text + "def broken(:\n")


@pytest.mark.parametrize("mode", [[], ["--in-place"], ["--in-place", "--partial"]])
@pytest.mark.parametrize("failure, message", [
    (_planted_bug, "utils.py: internal error while converting (RuntimeError: a planted bug); please report it"),
    (_invalid_output, "utils.py:{after}: conversion produced invalid code (invalid syntax); nothing written, please report it"),
])
def test_a_project_a_module_of_which_fails_to_convert_is_written_not_at_all(tmp_path, monkeypatch, mode, failure, message):
    """A module (utils.py) whose conversion raises or produces invalid code leaves every file of the project
    as it was, the entry included: the project is written whole or not at all; each file says what became
    of it, and exit 2."""
    import ddpify.convert

    real = ddpify.convert.convert_source

    def failing_on_utils(text, target, path=None, **options):
        return (failure if path and Path(path).name == "utils.py" else real)(text, target, path=path, **options)

    monkeypatch.setattr(ddpify.convert, "convert_source", failing_on_utils)
    project = copy_project(tmp_path, "classic")
    result = invoke(project / "train.py", "--to", "ddp", *mode)
    assert result.exit_code == 2, result.output
    assert python_files(project) == python_files(PROJECTS / "classic")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classic"]  # no mirror either
    lines = result.output.splitlines()
    after = len((project / "utils.py").read_text().splitlines()) + 1  # the line _invalid_output appends
    assert f"error: {project}/{message.format(after=after)}" in lines, result.output
    held = [line for line in lines if "failed to convert; nothing written" in line]
    assert [line.split(":")[0] for line in held] == [str(project / "train.py"), str(project / "data.py")], result.output

def test_a_directory_is_searched_for_entry_points(tmp_path):
    for name in ENTRIES:
        copy_project(tmp_path, name)
    check = invoke(tmp_path, "--to", "ddp", "--check")
    found = {Path(p).relative_to(tmp_path).as_posix() for p in re.findall(r"^would convert (.*)$", check.stdout, re.M)}
    expected = {f"{name}/{path}" for name, entry in ENTRIES.items() for path in (entry, *CHANGED_MODULES[name])}
    assert found == expected  # model.py has a __main__ block, but train.py imports it: a library
    assert invoke(tmp_path, "--to", "ddp").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith("_ddp")) == sorted(f"{n}_ddp" for n in ENTRIES)
    assert not SETUP_CALL.search((tmp_path / "classic_ddp" / "model.py").read_text())


# ===== what crosses a file boundary =============================================================
def write_project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def converted(root: Path, entry: str) -> dict[str, str]:
    conversion = convert_entry(root / entry, "ddp", {"batch_size": "per-gpu"})
    return {job.path.relative_to(root).as_posix(): job.convert().output for job in conversion.jobs}


MAIN_TRAINS = """
def main(loader, model, criterion):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
"""


NET_WITH_BATCHNORM = """
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(1)
    def forward(self, x):
        return self.bn(x)
"""


def trains_net_from(module: str) -> str:
    """An entry script training the `Net` of `module`."""
    return f"import torch\nfrom torch.utils.data import DataLoader\nfrom {module} import Net\n" + MAIN_TRAINS + (
        "if __name__ == '__main__':\n    model = Net()\n    main(DataLoader(list(range(8)), shuffle=True), model, torch.nn.MSELoss())\n")


def test_an_imported_model_class_with_batchnorm_gets_syncbatchnorm(tmp_path):
    write_project(tmp_path, {
        "nets/__init__.py": "",
        "nets/cnn.py": NET_WITH_BATCHNORM,
        "train.py": trains_net_from("nets.cnn"),
    })
    out = converted(tmp_path, "train.py")
    assert "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)" in out["train.py"]
    assert "model = DDP(\n" in out["train.py"]


def test_a_loop_in_an_imported_function_gets_set_epoch_in_the_caller_and_module_in_the_callee(tmp_path):
    write_project(tmp_path, {
        "engine.py": """
            def fit_epoch(model, loader, optimizer, criterion):
                print(model.describe())
                for x, y in loader:
                    optimizer.zero_grad()
                    criterion(model(x), y).backward()
                    optimizer.step()
        """,
        "train.py": """
            import torch
            import engine
            from torch.utils.data import DataLoader
            class Net(torch.nn.Module):
                def forward(self, x):
                    return x
                def describe(self):
                    return "net"
            if __name__ == "__main__":
                model = Net()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                loader = DataLoader(list(range(8)), shuffle=True)
                for epoch in range(2):
                    engine.fit_epoch(model, loader, optimizer, torch.nn.MSELoss())
        """,
    })
    out = converted(tmp_path, "train.py")
    assert "sampler=DistributedSampler(" in out["train.py"]
    assert re.search(r"for epoch in range\(2\):\n\s+loader\.sampler\.set_epoch\(epoch\)", out["train.py"])
    assert "print(model.module.describe())" in out["engine.py"]
    assert "if RANK == 0:" in out["engine.py"] and not SETUP_CALL.search(out["engine.py"])


def test_a_relative_import_in_a_package_is_followed_to_the_loader(tmp_path):
    write_project(tmp_path, {
        "data/__init__.py": "from .loader import get_loader\n",
        "data/loader.py": """
            from torch.utils.data import DataLoader
            def get_loader():
                return DataLoader(list(range(8)), batch_size=2, shuffle=True)
        """,
        "train.py": "import torch\nfrom data import get_loader\n" + MAIN_TRAINS + (
            "if __name__ == '__main__':\n    model = torch.nn.Linear(1, 1)\n    main(get_loader(), model, torch.nn.MSELoss())\n"),
    })
    out = converted(tmp_path, "train.py")
    assert "sampler=DistributedSampler(" in out["data/loader.py"]
    assert "loader.sampler.set_epoch(epoch)" in out["train.py"]
    assert "DistributedSampler" not in out["train.py"].replace("sampler.set_epoch", "")
    assert out["data/__init__.py"] == "from .loader import get_loader\n"


# ===== execution ================================================================================
def torchrun(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    return run_script(argv, cwd=cwd, timeout=240)


def step_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if re.match(r"epoch \d+ step \d+ ", line)]


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_converted_project_runs_under_torchrun_and_logs_once(name: str, mirrors, tmp_path):
    for side in ("original", "ddp"):
        (tmp_path / side).mkdir()
    original = run_script([sys.executable, str(PROJECTS / name / ENTRIES[name])], cwd=tmp_path / "original", timeout=240)
    assert original.returncode == 0, failure_report(original)
    run = torchrun(mirrors[name] / ENTRIES[name], tmp_path / "ddp")
    assert run.returncode == 0, failure_report(run)
    assert run.stdout.count("done\n") == 1, "rank 0 alone logs"
    assert len(step_lines(run.stdout)) * 2 == len(step_lines(original.stdout)), "each rank trains on half of every epoch"
    assert written_files(tmp_path / "ddp") == written_files(tmp_path / "original")


# --to dp: utils.py reaches the wrapped model's own method through .module (classic); the entry itself
# needs no edit while trainer/core.py wraps the model (trainer_package)
@pytest.mark.parametrize("name, target", [(name, "ddp") for name in sorted(ENTRIES)] + [("classic", "dp"), ("trainer_package", "dp")])
def test_verify_converts_the_whole_project_and_finds_it_equivalent(name: str, target: str):
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # run from the projects' folder (above the project, as from the repository root): each side mirrors it, not the repository
    proc = run_ddpify(["verify", str(PROJECTS / name / ENTRIES[name]), "--to", target, "--json", "--timeout", "200"], PROJECTS, env, 300)
    result = json.loads(proc.stdout)
    assert (proc.returncode, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]


def test_a_method_of_an_imported_class_that_loops_over_epochs_gets_set_epoch_there(tmp_path):
    write_project(tmp_path, {
        "engine.py": """
            import torch
            class Engine:
                def __init__(self, model):
                    self.model = model
                    self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                def fit(self, loader, epochs):
                    for epoch in range(epochs):
                        for x, y in loader:
                            self.optimizer.zero_grad()
                            torch.nn.functional.mse_loss(self.model(x), y).backward()
                            self.optimizer.step()
        """,
        "train.py": """
            import torch
            from torch.utils.data import DataLoader
            from engine import Engine
            if __name__ == "__main__":
                engine = Engine(torch.nn.Linear(1, 1))
                engine.fit(DataLoader(list(range(8)), shuffle=True), epochs=2)
        """,
    })
    out = converted(tmp_path, "train.py")
    assert "sampler=DistributedSampler(" in out["train.py"]
    assert re.search(r"for epoch in range\(epochs\):\n\s+loader\.sampler\.set_epoch\(epoch\)", out["engine.py"])


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_converted_project_lints_clean(name: str, mirrors):
    result = CliRunner().invoke(cli, ["lint", str(mirrors[name])], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_an_entry_inside_a_package_imports_from_the_package_root(tmp_path):
    write_project(tmp_path / "proj", {
        "pkg/__init__.py": "",
        "pkg/model.py": NET_WITH_BATCHNORM,
        "pkg/train.py": trains_net_from("pkg.model"),
    })
    conversion = convert_entry(tmp_path / "proj" / "pkg" / "train.py", "ddp", {"batch_size": "per-gpu"})
    assert sorted(m.name for m in conversion.project.files()) == ["pkg", "pkg.model", "train"]
    assert "convert_sync_batchnorm" in conversion.job(tmp_path / "proj" / "pkg" / "train.py").convert().output


def test_a_loader_evaluated_in_another_file_is_not_reported_as_never_iterated(tmp_path):
    write_project(tmp_path, {
        "metrics.py": """
            def accuracy(model, loader):
                total = 0.0
                for x in loader:
                    total += float(model(x).sum())
                return total
        """,
        "train.py": "import torch\nfrom torch.utils.data import DataLoader\nfrom metrics import accuracy\n" + MAIN_TRAINS + (
            "if __name__ == '__main__':\n    model = torch.nn.Linear(1, 1)\n"
            "    main(DataLoader(list(range(8)), shuffle=True), model, torch.nn.MSELoss())\n"
            "    print(accuracy(model, DataLoader(list(range(4)))))\n"),
    })
    result = convert_entry(tmp_path / "train.py", "ddp", {"batch_size": "per-gpu"}).job(tmp_path / "train.py").convert()
    messages = [a.message for a in result.advice]
    assert not any("not iterated" in m for m in messages), messages
    assert not result.missing, result.missing


def test_the_modules_of_an_entry_already_distributed_are_left_alone(tmp_path):
    """nanoGPT's shape: train.py already runs DDP; the model.py it imports prints, which is its own business."""
    write_project(tmp_path, {
        "model.py": """
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self, fast=False):
                    super().__init__()
                    self.fc = nn.Linear(4, 1)
                    if not fast:
                        print("WARNING: the slow path")
                def forward(self, x):
                    return self.fc(x)
                def configure_optimizers(self, lr):
                    return torch.optim.AdamW(self.parameters(), lr=lr)
        """,
        "train.py": """
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            from model import Net
            dist.init_process_group("gloo")
            model = DDP(Net())
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        """,
    })
    before = python_files(tmp_path)
    result = invoke(tmp_path / "train.py", "--to", "ddp")
    assert result.exit_code == 0 and "already distributed" in result.output, result.output
    assert python_files(tmp_path) == before and not (tmp_path.parent / f"{tmp_path.name}_ddp").exists()
