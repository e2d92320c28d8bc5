"""A model that builds and steps its own optimizer (ddpify.anatomy.owned_optimizers): its gradients are
averaged by hand, since no DDP wrapper reaches a model the script never holds in a variable of its own
training loop. Reinforcement learning's cases are in tests/test_environments.py; here, supervised
training, where the averaged gradient of the ranks' rows is the single-process one, exactly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify  # noqa: E402

REGRESSOR = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
        self.optimizer = torch.optim.SGD(self.parameters(), lr=0.05)

    def forward(self, x):
        return self.fc(x)

    def train_step(self, x, y):
        loss = nn.functional.mse_loss(self(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def main():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = Regressor()
    for epoch in range(3):
        for xb, yb in loader:
            loss = model.train_step(xb, yb)
        print(epoch, loss)


if __name__ == "__main__":
    main()
'''


def test_a_model_that_steps_its_own_optimizer_is_averaged_not_wrapped():
    result = convert_source(REGRESSOR, "ddp", path="regressor.py")
    assert result.status is Status.CONVERTED, result.missing
    assert "DDP(" not in result.output
    assert "        broadcast_parameters(self.optimizer)\n" in result.output
    assert "        loss.backward()\n        average_gradients(self.optimizer)\n        self.optimizer.step()\n" in result.output


def test_the_other_targets_still_say_where_the_model_is_missing():
    for target in ("dp", "fsdp"):
        result = convert_source(REGRESSOR, target, path="regressor.py")
        assert result.status is Status.INCOMPLETE, target
        assert "average_gradients" not in result.output


def test_verify_finds_it_exactly_equivalent_on_two_ranks(tmp_path: Path):
    (tmp_path / "regressor.py").write_text(REGRESSOR)
    done = run_ddpify(["verify", "regressor.py", "--to", "ddp", "--json"], tmp_path, timeout=300)
    result = json.loads(done.stdout[done.stdout.index("{"):])
    assert (result["verdict"], result["mode"]) == ("equivalent", "exact"), result["message"]


def test_in_an_imported_module_it_is_missing_with_the_recipe(tmp_path: Path):
    """An imported module gets the rank constants, not the process-group setup after which the averaging
    helpers go: the optimizer its model owns is named, and nothing is written."""
    model, main = REGRESSOR.split("\n\ndef main():")
    (tmp_path / "model.py").write_text(model + "\n\ndef fit(model, loader):\n    for xb, yb in loader:\n        loss = model.train_step(xb, yb)\n    print(loss)\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\nfrom model import Regressor, fit\n\n\n"
        "def main():\n    x = torch.randn(64, 8)\n    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)\n"
        "    fit(Regressor(), loader)\n\n\nif __name__ == \"__main__\":\n    main()\n")
    done = run_ddpify(["convert", "train.py", "--to", "ddp"], tmp_path, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "model.py:11: missing: self.optimizer trains its own class's parameters" in done.stdout + done.stderr
    assert not (tmp_path / "model_ddp.py").exists() and not (tmp_path / "train_ddp").exists()
