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

NumPy's noise for the training batch (`np.random.normal(0, 1, mu.shape)` in an encoder's forward, a GAN's
`np.random.randn(batch_size, nz)`) is drawn alike the same way (at 718c72b: statistical, each rank drawing
from numpy's own global generator), while a port that scales it diverges at step 1 and one that draws it from
another law (normal's scale) diverges too; draws of other rows, or whose law is given per row, are left alone.

Each test runs `ddpify verify --to ddp` (2 ranks, gloo) on a script written here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from ddpify.verify.aligned_draws import TrainingBatch, batch_shaped_draw

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


NUMPY_NOISE = """
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Reparameterized(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.mu = nn.Linear(features, features)

    def forward(self, x):
        mu = self.mu(x)
        return mu + torch.tensor(np.random.normal(0, 1, mu.shape), dtype=torch.float32)


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = nn.Sequential(Reparameterized(12), nn.Tanh(), nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in loader:
            rows = xb.size(0)
            noise = np.concatenate([np.random.randn(rows, 2), np.random.rand(rows, 2),
                                    np.random.uniform(-1, 1, (rows, 2)), np.random.standard_normal((rows, 2))], 1)
            loss = nn.functional.mse_loss(model(torch.cat([xb, torch.tensor(noise, dtype=torch.float32)], 1)), yb)
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


def test_the_statistical_reason_names_the_draw_not_drawn_alike(tmp_path):
    noise = "torch.randn(xb.size(0), 4)"
    result = verify(tmp_path, BATCH_NOISE.replace(noise, f"{noise} * (1 + torch.rand(1))"))
    assert result["mode"] == "statistical", result["notes"]
    reason = next(note for note in result["notes"] if "compared in statistical mode" in note)
    assert "(torch.rand between training steps, in main() at train.py:16)" in reason, reason


def test_numpy_noise_for_the_training_batch_is_drawn_alike_and_compared_exactly(tmp_path):
    result = verify(tmp_path, NUMPY_NOISE)
    assert result["verdict"] == "equivalent", result["message"]
    assert result["mode"] == "exact", result["notes"]
    assert any("drew exactly the reference's numbers" in note for note in result["notes"]), result["notes"]


def test_a_port_scaling_the_drawn_numpy_noise_otherwise_diverges_at_step_1(tmp_path):
    noise = "np.random.randn(rows, 2)"
    result = verify(tmp_path, NUMPY_NOISE, "--against", wrong_port(tmp_path, NUMPY_NOISE, noise, f"2 * {noise}"))
    assert result["verdict"] == "diverged" and result["diverged_at"] == 1, result["message"]


def test_a_port_drawing_numpy_noise_from_another_law_still_diverges(tmp_path):
    noise = "np.random.normal(0, 1, mu.shape)"
    result = verify(tmp_path, NUMPY_NOISE, "--against", wrong_port(tmp_path, NUMPY_NOISE, noise, noise.replace("0, 1", "0, 3")))
    assert result["verdict"] == "diverged", result["message"]


@pytest.fixture
def training_batch(monkeypatch):
    """TrainingBatch as this test leaves it is put back afterwards."""
    monkeypatch.setattr(TrainingBatch, "rows", None)
    monkeypatch.setattr(TrainingBatch, "draws", 0)


def draw_as(world: int, rank: int, rows: int, name: str, *args, **kwargs):
    """batch_shaped_draw of `np.random.name(*args, **kwargs)` as the first batch-shaped draw of a process whose
    last training batch had `rows` rows."""
    TrainingBatch.rows, TrainingBatch.draws = rows, 0
    return batch_shaped_draw(np.random, name, args, kwargs, getattr(np.random, name)(*args, **kwargs), world, rank)


@pytest.mark.parametrize("name, arguments", [
    ("normal", lambda rows: ((0.5, 2), {"size": (rows, 3)})), ("uniform", lambda rows: ((-1, 1, (rows, 3)), {})),
    ("standard_normal", lambda rows: (((rows, 3),), {})), ("randn", lambda rows: ((rows, 3), {})),
    ("rand", lambda rows: ((rows, 3), {})), ("random", lambda rows: (((rows, 1, 1),), {})),
    ("random_sample", lambda rows: ((), {"size": (rows, 3)})),
])
def test_each_rank_keeps_its_rows_of_the_references_numpy_draw(training_batch, name, arguments):
    args, kwargs = arguments(4)
    reference, whole = draw_as(1, 0, 4, name, *args, **kwargs)
    args, kwargs = arguments(2)
    ranks = [draw_as(2, rank, 2, name, *args, **kwargs) for rank in (0, 1)]
    assert all(np.array_equal(rank_whole, whole) for _, rank_whole in ranks)
    assert np.array_equal(np.concatenate([own for own, _ in ranks]), reference)


@pytest.mark.parametrize("name, args", [
    ("normal", (np.zeros((4, 3)), 1)),  # its law given per row
    ("normal", (0, 1, (5, 3))),  # rows other than the batch's
    ("choice", (10, 4)),  # not noise
])
def test_other_numpy_draws_are_left_alone(training_batch, name, args):
    assert draw_as(1, 0, 4, name, *args) is None
