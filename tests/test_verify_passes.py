"""verify's reference numbers its passes over the training data as the candidate's samplers do
(`set_epoch(epoch)`), and the data each pass augments is seeded by that pass's epoch, in the
loader's worker processes too. Each test runs `ddpify verify --to ddp` (2 ranks, gloo) on a
project written here; at 15d986c both said `diverged`.
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

DATA_MODULE = '''
import torch
from torch.utils.data import DataLoader, Dataset


class Jittered(Dataset):
    """Points with noise drawn per sample, as an augmentation draws it."""

    def __init__(self, n):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=generator)
        self.y = torch.randint(0, 2, (n,), generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index] + 0.5 * torch.rand(8), self.y[index]


def training_loader(workers):
    return DataLoader(Jittered(16), batch_size=4, shuffle=True, num_workers=workers)
'''

TRAIN_SCRIPT = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from data import Jittered, training_loader


def evaluate(model, loader):
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += nn.functional.cross_entropy(model(x), y, reduction="sum").item()
    return total / len(loader.dataset)


def main():
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = LOADER
    test_loader = DataLoader(Jittered(8), batch_size=4, shuffle=True)
    for epoch in range(1, 4):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} test loss {evaluate(model, test_loader):.4f}")


if __name__ == "__main__":
    main()
'''


def verify_project(folder: Path, loader: str) -> dict:
    """Write the project, train.py's training loader built by the expression `loader`, and verify train.py
    over 3 epochs of 2 steps."""
    (folder / "data.py").write_text(DATA_MODULE)
    (folder / "train.py").write_text(TRAIN_SCRIPT.replace("LOADER", loader))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    done = run_ddpify(["verify", "train.py", "--to", "ddp", "--steps", "6", "--timeout", "150", "--json"], folder, env, TIMEOUT_S)
    return json.loads(done.stdout)


def test_a_loader_a_project_function_builds_is_cut_by_the_epochs_the_ranks_set(tmp_path):
    """`for epoch in range(1, 4)` around `training_loader()` of data.py: the candidate sets epochs 1, 2, 3, and
    the reference must shuffle its passes by those epochs, not count them from 0."""
    result = verify_project(tmp_path, "training_loader(workers=0)")
    assert result["verdict"] == "equivalent", result["message"]
    assert any("training loader at train.py:" in note for note in result["notes"]), result["notes"]


def test_workers_augment_with_the_epoch_of_their_own_pass(tmp_path):
    """Loader workers fork as a pass starts: their per-sample seeds must read that pass's epoch, in both runs,
    whatever pass ran last (the candidate's sharded evaluation sets no training epoch)."""
    result = verify_project(tmp_path, "DataLoader(Jittered(16), batch_size=4, shuffle=True, num_workers=2)")
    assert result["verdict"] == "equivalent", result["message"]
    assert len(result["steps"]) == 6
