"""A model the training step calls through methods other than forward (`net.policy(s)`, `net.value(s)`:
synchronous advantage actor-critic, minimalRL's A2C): a DDP wrapper all-reduces only after a forward
through itself, so `net.module.policy(s)` would leave every rank its own gradients. The conversion
averages that model's optimizer by hand instead (ddpify.anatomy.owned_optimizers), and worker
processes that only step environments for the one learner are not A3C's training workers."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import ranks_alike, run_script  # noqa: E402

LEARNER = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "rl_env_workers_one_learner.py"
SAVED_ON_RANK_ZERO = '    if RANK == 0:\n        torch.save(net.state_dict(), "learner.pt")\n'
AVERAGE = "        average_gradients(optimizer)\n"
RUN_TIMEOUT_S = 120


def convert() -> str:
    result = convert_source(LEARNER.read_text(), "ddp", path=LEARNER.name)
    assert result.status is Status.CONVERTED, result.missing
    return result.output


def test_the_learner_is_averaged_by_hand_and_its_environment_workers_kept():
    output = convert()
    assert "DDP(" not in output and ".module." not in output
    assert "    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)\n    broadcast_parameters(optimizer)\n" in output
    assert "        loss.backward()\n" + AVERAGE + "        optimizer.step()\n" in output
    assert "observation = env.reset(seed=index + RANK)" in output
    assert "mp.Process(target=serve" in output


def test_at_world_size_one_it_trains_exactly_as_the_original(tmp_path: Path):
    """Under plain `python` the broadcast and the average change no number: the same prints, the same parameters."""
    saved = {}
    for name, text in (("original", LEARNER.read_text()), ("converted", convert())):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rl.py").write_text(text)
        done = run_script([sys.executable, "rl.py"], tmp_path / name, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        saved[name] = done.stdout, torch.load(tmp_path / name / "learner.pt")
    assert saved["converted"][0] == saved["original"][0]
    assert all(torch.equal(saved["converted"][1][k], saved["original"][1][k]) for k in saved["original"][1])


def test_two_ranks_hold_the_same_learner_only_because_its_gradients_are_averaged(tmp_path: Path):
    """Each rank saves its learner: alike with the average, apart without it (the ranks play other
    episodes), which is what a DDP wrapper reached past its forward would leave."""
    converted = convert().replace(SAVED_ON_RANK_ZERO, '    torch.save(net.state_dict(), f"learner{RANK}.pt")\n')
    unaveraged = converted.replace(AVERAGE, "")
    assert "learner{RANK}.pt" in converted and AVERAGE not in unaveraged
    alike = ranks_alike(tmp_path, {"averaged": converted, "unaveraged": unaveraged}, "learner{RANK}.pt", RUN_TIMEOUT_S)
    assert alike == {"averaged": True, "unaveraged": False}


def test_a_supervised_model_trained_through_a_method_is_averaged_too():
    script = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

    def embed(self, x):
        return torch.tanh(self.fc(x))


torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=8, shuffle=True)
model = Encoder()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.mse_loss(model.embed(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''
    result = convert_source(script, "ddp", path="embed.py")
    assert result.status is Status.CONVERTED, result.missing
    assert "DDP(" not in result.output
    assert "        loss.backward()\n        average_gradients(optimizer)\n        optimizer.step()\n" in result.output
