"""verify on scripts whose runs differ by noise, and what it still proves.

Float noise an adaptive optimizer amplifies: a bias just before a BatchNorm has a gradient of exactly zero
in theory, so the reference's and the ranks' differ in float noise only, which Adam's first step
(lr * sign(grad)) turns into whole steps. The gradients match, the update cannot: verify says so and
compares the later steps statistically, while a port that really updates otherwise (its learning rate)
still diverges at step 1 (at df616ec the BatchNorm script said `diverged at step 1`).

Noise drawn for each training batch (a GAN's `torch.randn(batch_size, nz)`): the reference draws the noise
of its whole batch, each rank its own rows of that same draw, so the runs are compared exactly (at df616ec:
statistically, each rank drawing its own noise, which a GAN's few steps cannot settle), and a port that
scales that noise otherwise diverges at step 1.

Each test runs `ddpify verify --to ddp` (2 ranks, gloo) on a script written here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify  # noqa: E402

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240

BATCHNORM_ADAM = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = (x ** 2).sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(4, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 32), nn.BatchNorm1d(32),
                          nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(2):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


BATCH_NOISE = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in loader:
            noise = torch.randn(xb.size(0), 4)
            loss = nn.functional.mse_loss(model(torch.cat([xb, noise], 1)), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def verify(folder: Path, script: str, *args: str) -> dict:
    """`ddpify verify train.py --to ddp` of `script` (6 steps), in `folder`; ARGS added (`--against PORT`)."""
    (folder / "train.py").write_text(script)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    done = run_ddpify(["verify", "train.py", "--to", "ddp", "--steps", "6", "--timeout", "150", "--json", *args], folder, env, TIMEOUT_S)
    return json.loads(done.stdout)


def wrong_port(folder: Path, script: str, right: str, wrong: str) -> str:
    """Write ddpify's conversion of `script` with `right` replaced by `wrong` as wrong.py; its name."""
    (folder / "train.py").write_text(script)
    converted = run_ddpify(["convert", "train.py", "--to", "ddp", "-o", "-"], folder, timeout=120).stdout
    assert right in converted
    (folder / "wrong.py").write_text(converted.replace(right, wrong))
    return "wrong.py"


def test_float_noise_that_adam_amplifies_is_named_and_the_rest_compared_statistically(tmp_path):
    result = verify(tmp_path, BATCHNORM_ADAM)
    assert result["verdict"] == "equivalent", result["message"]
    assert result["message"].startswith("equivalent (exact through step 1's gradients, then statistical")
    assert result["mode"] == "statistical"
    assert any("float noise" in note and "from step 2" in note for note in result["notes"]), result["notes"]


def test_a_port_whose_updates_differ_with_matching_gradients_still_diverges_at_step_1(tmp_path):
    result = verify(tmp_path, BATCHNORM_ADAM, "--against", wrong_port(tmp_path, BATCHNORM_ADAM, "lr=0.01", "lr=0.02"))
    assert result["verdict"] == "diverged" and result["diverged_at"] == 1, result["message"]


def test_noise_for_the_training_batch_is_drawn_alike_and_compared_exactly(tmp_path):
    result = verify(tmp_path, BATCH_NOISE)
    assert result["verdict"] == "equivalent", result["message"]
    assert result["mode"] == "exact", result["notes"]
    assert any("drew exactly the reference's numbers" in note for note in result["notes"]), result["notes"]


def test_a_port_scaling_the_drawn_noise_otherwise_diverges_at_step_1(tmp_path):
    noise = "torch.randn(xb.size(0), 4)"
    result = verify(tmp_path, BATCH_NOISE, "--against", wrong_port(tmp_path, BATCH_NOISE, noise, f"2 * {noise}"))
    assert result["verdict"] == "diverged" and result["diverged_at"] == 1, result["message"]
