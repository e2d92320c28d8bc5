"""The `ddpify-lint` pre-commit hook, run with `pre-commit try-repo` on a throwaway git repository.

try-repo installs this repository's committed HEAD (plus uncommitted changes to tracked files)
into a fresh virtualenv, so the hook sees what users would get. The virtualenv is allowed to see
the system site-packages, so torch is not downloaded again (an editable install of ddpify there
could stand in for a subpackage the build left out; the package list has its own test).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
BAD_SCRIPT = (
    "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
    "state = torch.load('ckpt.pt')\n"
)


def _git_checkout(path: Path) -> bool:
    if shutil.which("git") is None:
        return False
    probe = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return probe.returncode == 0 and Path(probe.stdout.strip()).resolve() == path


@pytest.mark.skipif(shutil.which("pre-commit") is None, reason="pre-commit is not installed")
@pytest.mark.skipif(not _git_checkout(REPO_ROOT), reason="the repository root is not a git checkout")
def test_ddpify_lint_hook_fails_on_a_bad_ddp_script(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(BAD_SCRIPT)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "train.py"], cwd=project, check=True)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "VIRTUALENV_SYSTEM_SITE_PACKAGES": "1"}
    run = subprocess.run(
        ["pre-commit", "try-repo", str(REPO_ROOT), "ddpify-lint", "--all-files"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "train.py:5:9: DDP001" in output, output
