"""A model trained through a method that runs its forward inside (`D1.compute_loss(x, gt)` that calls
`self(x)`: the public corpus's MUNIT, whose discriminators come from `from models import *`): a DDP
wrapper all-reduces only after a forward through itself, so `D1.module.compute_loss(...)` left every
rank its own discriminators, silently. The conversion averages their optimizers by hand instead
(ddpify.anatomy.owned_optimizers), whether the class is this file's, another file's or one no file of
the project names; a method that only calls forward is called through the wrapper; a model whose
optimizer cannot be averaged by hand leaves the conversion incomplete."""

from __future__ import annotations

import sys
from pathlib import Path

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source
from ddpify.project_conversion import convert_entry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import ranks_alike, run_ddpify  # noqa: E402

GAN = Path(__file__).resolve().parents[1] / "fixtures" / "loss_methods"
SAVED_ON_RANK_ZERO = ('if RANK == 0:\n    torch.save({"G": G.module.state_dict(), "D1": D1.state_dict(), "D2": D2.state_dict()}, '
                      '"gan.pt")\n')
SAVED_BY_EACH_RANK = ('torch.save({f"{n}.{k}": v for n, m in (("G", G.module), ("D1", D1), ("D2", D2)) '
                      'for k, v in m.state_dict().items()}, f"gan{RANK}.pt")\n')
AVERAGES = ("        average_gradients(optimizer_D1)\n", "        average_gradients(optimizer_D2)\n")
RUN_TIMEOUT_S = 180
DISCRIMINATOR = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    def compute_loss(self, x, gt):
        return self(x, gt)

    def forward(self, x, gt):
        return torch.mean((self.net(x) - gt) ** 2)


torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 4)), batch_size=8, shuffle=True)
D = Discriminator()
optimizer = torch.optim.SGD(D.parameters(), lr=0.1)
for epoch in range(2):
    for x1, x2 in loader:
        optimizer.zero_grad()
        loss = D.compute_loss(x1, 1) + D.compute_loss(x2, 0)
        loss.backward()
        optimizer.step()
torch.save(D.state_dict(), "d.pt")
'''

TRAINER = '''
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, D):
        self.D = D
        self.optimizer = torch.optim.SGD(self.D.parameters(), lr=0.1)

    def fit(self, loader, epochs):
        for epoch in range(epochs):
            for x1, x2 in loader:
                self.optimizer.zero_grad()
                loss = self.D.compute_loss(x1, 1) + self.D.compute_loss(x2, 0)
                loss.backward()
                self.optimizer.step()


loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 4)), batch_size=8, shuffle=True)
Trainer(Discriminator()).fit(loader, 2)
'''


def convert_gan() -> str:
    result = convert_entry(GAN / "train.py", "ddp", {}).job(GAN / "train.py").convert()
    assert result.status is Status.CONVERTED, result.missing
    return result.output


def test_discriminators_of_a_star_import_are_averaged_by_hand_not_reached_through_module():
    output = convert_gan()
    assert ".module.compute_loss" not in output and "D1 = DDP(" not in output and "D2 = DDP(" not in output
    assert "G = DDP(" in output
    for name, average in zip(("D1", "D2"), AVERAGES):
        assert f"optimizer_{name} = torch.optim.Adam({name}.parameters(), lr=0.01)\nbroadcast_parameters(optimizer_{name})\n" in output
        assert f"        loss_{name}.backward()\n{average}        optimizer_{name}.step()\n" in output


def test_two_ranks_hold_the_same_discriminators_only_because_their_gradients_are_averaged(tmp_path: Path):
    """Each rank saves its models: alike with the averages, apart without them (each rank trains on its
    own shard), which is what the wrapper reached past its forward (`D1.module.compute_loss`) left."""
    converted = convert_gan()
    assert SAVED_ON_RANK_ZERO in converted
    converted = converted.replace(SAVED_ON_RANK_ZERO, SAVED_BY_EACH_RANK)
    unaveraged = converted.replace(AVERAGES[0], "").replace(AVERAGES[1], "")
    beside = {"models.py": (GAN / "models.py").read_text()}
    alike = ranks_alike(tmp_path, {"averaged": converted, "unaveraged": unaveraged}, "gan{RANK}.pt", RUN_TIMEOUT_S, beside)
    assert alike == {"averaged": True, "unaveraged": False}


def test_a_method_that_only_calls_forward_goes_through_the_wrapper(tmp_path: Path):
    result = convert_source(DISCRIMINATOR, "ddp", path="d.py")
    assert result.status is Status.CONVERTED, result.missing
    assert "        loss = D(x1, 1) + D(x2, 0)\n" in result.output and ".module.compute_loss" not in result.output
    per_rank = result.output.replace('if RANK == 0:\n    torch.save(D.module.state_dict(), "d.pt")\n',
                                     'torch.save(D.module.state_dict(), f"d{RANK}.pt")\n')
    assert 'f"d{RANK}.pt"' in per_rank
    assert ranks_alike(tmp_path, {"wrapped": per_rank}, "d{RANK}.pt", RUN_TIMEOUT_S) == {"wrapped": True}


def test_a_model_trained_past_forward_with_no_optimizer_to_average_is_incomplete():
    script = (GAN / "models.py").read_text() + (GAN / "train.py").read_text().replace("from models import *\n", "")
    script = script.replace("optimizer_D1 = torch.optim.Adam(D1.parameters(), lr=0.01)",
                            'optimizers = {"D1": torch.optim.Adam(D1.parameters(), lr=0.01)}')
    script = script.replace("optimizer_D1.", 'optimizers["D1"].')
    result = convert_source(script, "ddp", path="gan.py")
    assert result.status is Status.INCOMPLETE
    assert any("D1 is trained through D1.compute_loss(...), past the forward a DDP wrapper syncs" in m.what for m in result.missing)


def test_an_optimizer_a_trainer_keeps_over_the_model_is_averaged_by_hand():
    """`self.optimizer = SGD(self.D.parameters())`, the method called on `self.D` inside `fit`."""
    output = convert_source((GAN / "models.py").read_text() + TRAINER, "ddp", path="trainer.py").output
    assert ".module.compute_loss" not in output and "DDP(" not in output
    assert "        self.optimizer = torch.optim.SGD(self.D.parameters(), lr=0.1)\n        broadcast_parameters(self.optimizer)\n" in output
    assert "                loss.backward()\n                average_gradients(self.optimizer)\n                self.optimizer.step()\n" in output


def test_fsdp_leaves_no_discriminator_unsharded_and_unaveraged():
    """The wrap leaves them to the averaging by hand, which only DDP's conversion has: FSDP's is incomplete."""
    result = convert_entry(GAN / "train.py", "fsdp", {}).job(GAN / "train.py").convert()
    assert result.status is Status.INCOMPLETE
    assert {m.line for m in result.missing if "it is not sharded, and no gradient of it is averaged" in m.what} == {15, 16}



CONFIGURED_MODEL = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def configure_optimizers(self, lr):
        return torch.optim.SGD(self.parameters(), lr=lr)

    def forward(self, x, y):
        out = self.fc(x)
        return out, torch.mean((out - y) ** 2)
'''
CONFIGURED_TRAINER = '''
class Trainer:
    def __init__(self, model, loader, lr):
        self.model = model
        self.loader = loader
        self.lr = lr

    def run(self):
        model, lr = self.model, self.lr
        self.optimizer = model.configure_optimizers(lr)
        for epoch in range(2):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                out, self.loss = model(x, y)
                self.loss.backward()
                self.optimizer.step()
'''
CONFIGURED_ENTRY = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

from model import Net
from trainer import Trainer

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
Trainer(Net(), loader, 0.1).run()
'''


def test_a_method_that_builds_the_optimizer_is_not_training_past_forward(tmp_path: Path):
    """`self.optimizer = model.configure_optimizers(...)` in a Trainer handed the model (minGPT's shape)
    returns no loss: the model is wrapped and trained through its forward, not averaged by hand (the public
    corpus's mingpt entries ended incomplete for it)."""
    for name, text in (("model.py", CONFIGURED_MODEL), ("trainer.py", CONFIGURED_TRAINER), ("train.py", CONFIGURED_ENTRY)):
        (tmp_path / name).write_text(text)
    done = run_ddpify(["convert", "train.py", "--to", "ddp", "--in-place"], tmp_path, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "average_gradients" not in (tmp_path / "trainer.py").read_text()
