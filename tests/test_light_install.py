"""`pip install ddpify` without torch: lint, convert and explain never import it; verify says how to get it.

Each command runs in a fresh interpreter whose import system refuses torch (a meta-path finder
raises ModuleNotFoundError for `torch` and its submodules), so any import of torch on their paths
fails the command; the child also reports whether torch ended up in `sys.modules`. The finder
refuses pygls and lsprotocol too (the `server` extra): only `ddpify server` may need them; and
LibCST's codemod framework and matchers, which none of these needs (importing them is 0.14 s of
every command's start-up).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = str(ROOT / "fixtures" / "basic_main.py")
BAD_DDP_SCRIPT = 'import torch\nimport torch.distributed as dist\n\ndist.init_process_group("gloo")\nstate = torch.load("ckpt.pt")\n'

_WITHOUT_TORCH = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "pygls", "lsprotocol") or name.startswith(("libcst.codemod", "libcst.matchers")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
from ddpify.cli import cli
try:
    cli.main(args=sys.argv[1:], prog_name="ddpify")
except SystemExit as done:
    code = done.code or 0
else:
    code = 0
print("TORCH-IMPORTED" if "torch" in sys.modules else "TORCH-ABSENT", file=sys.stderr)
sys.exit(code)
"""


def _run_without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("args", [
    ("lint", "BAD_DDP_SCRIPT", FIXTURE),
    ("convert", FIXTURE, "--to", "ddp", "--diff"),
    ("convert", FIXTURE, "--to", "dp", "--diff"),
    ("explain", FIXTURE),
], ids=["lint", "convert-ddp", "convert-dp", "explain"])
def test_command_runs_without_torch(args, tmp_path):
    bad = tmp_path / "train.py"
    bad.write_text(BAD_DDP_SCRIPT)
    run = _run_without_torch(*(str(bad) if a == "BAD_DDP_SCRIPT" else a for a in args))
    assert "TORCH-ABSENT" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "No module named" not in run.stderr, run.stderr
    assert run.returncode in (0, 1), run.stderr
    assert run.stdout.strip(), "the command printed nothing"
    if args[0] == "lint":
        assert "DDP001" in run.stdout


def test_verify_without_torch_names_the_extra_in_one_line():
    run = _run_without_torch("verify", FIXTURE, "--to", "ddp")
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line != "TORCH-ABSENT"]
    assert len(lines) == 1 and 'pip install "ddpify[verify]"' in lines[0], run.stderr


def test_server_without_pygls_names_the_extra_in_one_line():
    run = _run_without_torch("server")
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line != "TORCH-ABSENT"]
    assert len(lines) == 1 and 'pip install "ddpify[server]"' in lines[0], run.stderr


def test_torch_is_an_extra_not_a_dependency():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("torch") for dep in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(dep.startswith("torch") for dep in extras["verify"])
    assert "ddpify[verify]" in extras["test"]
    assert any(dep.startswith("matplotlib") for dep in extras["plot"]) and "ddpify[plot]" in extras["test"]
    assert not any(dep.startswith("pygls") for dep in project["dependencies"])
    assert any(dep.startswith("pygls") for dep in extras["server"]) and "ddpify[server]" in extras["test"]


def test_the_cli_index_names_each_command_of_each_command_module():
    """The CLI imports a command's module only when the command runs, by this index: it must not drift."""
    import importlib
    import pkgutil

    from ddpify import commands

    names = [info.name for info in pkgutil.iter_modules(commands.__path__)]
    defined = {command.name: name for name in names for command in importlib.import_module(f"ddpify.commands.{name}").COMMANDS}
    assert defined == commands.MODULE_OF
