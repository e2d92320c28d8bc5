"""verify on a script that draws noise for each training batch (a GAN's `torch.randn(batch_size, nz)`): the
reference draws the noise of its whole batch, each rank its own rows of that same draw, so the runs are
compared exactly (at df616ec: statistically, each rank drawing its own noise, which a GAN's few steps cannot
settle), and a port that scales that noise otherwise diverges at step 1. Each test runs `ddpify verify --to ddp` (2 ranks, gloo).
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


def verify(folder: Path, *args: str) -> dict:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    done = run_ddpify(["verify", "noisy.py", "--to", "ddp", "--steps", "6", "--timeout", "150", "--json", *args], folder, env, TIMEOUT_S)
    return json.loads(done.stdout)


def test_noise_for_the_training_batch_is_drawn_alike_and_compared_exactly(tmp_path):
    (tmp_path / "noisy.py").write_text(SCRIPT)
    result = verify(tmp_path)
    assert result["verdict"] == "equivalent", result["message"]
    assert result["mode"] == "exact", result["notes"]
    assert any("drew exactly the reference's numbers" in note for note in result["notes"]), result["notes"]


def test_a_port_drawing_other_noise_diverges(tmp_path):
    (tmp_path / "noisy.py").write_text(SCRIPT)
    converted = run_ddpify(["convert", "noisy.py", "--to", "ddp", "-o", "-"], tmp_path, timeout=120).stdout
    wrong = converted.replace("torch.randn(xb.size(0), 4)", "2 * torch.randn(xb.size(0), 4)")
    assert wrong != converted
    (tmp_path / "noisy_wrong.py").write_text(wrong)
    result = verify(tmp_path, "--against", "noisy_wrong.py")
    assert result["verdict"] == "diverged" and result["diverged_at"] == 1, result["message"]
