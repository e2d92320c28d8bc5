"""Data drawn from unseeded numpy and torch, then sharded by the DistributedSampler the conversion adds:
each rank would draw a data set of its own, so the shards would partition none. The conversion seeds
every RNG before the first draw (ddpify.codemods.ddp.seeds), and both ranks then hold the same data."""

from __future__ import annotations

import sys
from pathlib import Path

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_script  # noqa: E402

RUN_TIMEOUT_S = 180

DRAWN_DATA = '''
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

x = np.linspace(-1, 1, 64)[:, np.newaxis]
y = np.square(x) + np.random.normal(0, 0.1, x.shape)
features = torch.from_numpy(x).float() + 0.01 * torch.randn(64, 1)
dataset = TensorDataset(features, torch.from_numpy(y).float())
loader = DataLoader(dataset, batch_size=8, shuffle=True)


def main():
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for inputs, targets in loader:
            loss = nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(epoch, loss.item())


if __name__ == "__main__":
    main()
'''
# appended by the test to the converted script: each rank writes down the data set it shards
DATA_PROBE = '''
with open(f"data_of_rank_{RANK}.txt", "w") as probe:
    probe.write(f"{float(dataset.tensors[0].sum()):.6f} {float(dataset.tensors[1].sum()):.6f}")
'''


def test_the_data_is_seeded_before_its_first_draw():
    result = convert_source(DRAWN_DATA, "ddp", path="train.py")
    assert result.status is Status.CONVERTED, result.missing
    assert "seed_everything(0)\ny = np.square(x) + np.random.normal(" in result.output
    assert result.output.count("seed_everything(0)") == 1


def test_data_drawn_from_a_seeded_rng_gets_no_seed():
    seeded = DRAWN_DATA.replace("\nx = np.linspace", "\nnp.random.seed(1)\ntorch.manual_seed(1)\nx = np.linspace")
    result = convert_source(seeded, "ddp", path="train.py")
    assert result.status is Status.CONVERTED, result.missing
    assert "seed_everything" not in result.output


def test_every_rank_shards_the_same_data(tmp_path: Path):
    """Under torchrun on 2 ranks both hold the same drawn data set (unseeded, they differ)."""
    (tmp_path / "train.py").write_text(convert_source(DRAWN_DATA, "ddp").output + DATA_PROBE)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    done = run_script(torchrun, tmp_path, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    data = [(tmp_path / f"data_of_rank_{rank}.txt").read_text() for rank in (0, 1)]
    assert data[0] == data[1]
