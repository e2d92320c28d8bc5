"""verify on an adaptive optimizer whose gradients hold float noise: a bias just before a BatchNorm has a
gradient of exactly zero in theory, so the reference's and the ranks' differ in float noise only, which
Adam's first step (lr * sign(grad)) turns into whole steps. The gradients match, the update cannot: verify
says so and compares the later steps statistically, while a port that really updates otherwise (its
learning rate) still diverges at step 1. Each test runs `ddpify verify --to ddp` (2 ranks, gloo); at
df616ec the first one said `diverged at step 1`.
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

SCRIPT = """
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


def verify(folder: Path, *args: str) -> dict:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    done = run_ddpify(["verify", "bn_adam.py", "--to", "ddp", "--steps", "6", "--timeout", "150", "--json", *args], folder, env, TIMEOUT_S)
    return json.loads(done.stdout)


def test_float_noise_that_adam_amplifies_is_named_and_the_rest_compared_statistically(tmp_path):
    (tmp_path / "bn_adam.py").write_text(SCRIPT)
    result = verify(tmp_path)
    assert result["verdict"] == "equivalent", result["message"]
    assert result["message"].startswith("equivalent (exact through step 1's gradients, then statistical")
    assert result["mode"] == "statistical"
    assert any("float noise" in note and "from step 2" in note for note in result["notes"]), result["notes"]


def test_a_port_whose_updates_differ_with_matching_gradients_still_diverges_at_step_1(tmp_path):
    (tmp_path / "bn_adam.py").write_text(SCRIPT)
    converted = run_ddpify(["convert", "bn_adam.py", "--to", "ddp", "-o", "-"], tmp_path, timeout=120).stdout
    wrong = converted.replace("lr=0.01", "lr=0.02")
    assert wrong != converted
    (tmp_path / "bn_adam_wrong.py").write_text(wrong)
    result = verify(tmp_path, "--against", "bn_adam_wrong.py")
    assert result["verdict"] == "diverged" and result["diverged_at"] == 1, result["message"]
