"""Batches drawn at random, a sampler's epochs numbered in another file (issue 24).

A `get_batch()` that draws offsets with torch.randint into one token tensor, with a model that returns
its loss: each rank draws its own batches (the seed made again with the rank once the model is
wrapped), proven by running the output on 2 ranks (the ranks' batches differ, their parameters
agree) and by verify, which judges it statistically equivalent. A loader handed to a class of another
file whose step loop re-creates `iter(loader)`: that file numbers the epochs, so the entry does not
ask for a `for epoch` loop. A RandomSampler with replacement (minGPT's Trainer, in a file of its own,
with the optimizer from the model's configure_optimizers()): each rank draws from a generator seeded
with the rank, and the model handed to the Trainer is wrapped there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify, run_script  # noqa: E402

RUN_TIMEOUT_S = 180

GET_BATCH = """
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 64
block = 8
torch.manual_seed(7)
tokens = torch.randint(0, 12, (400,))


def get_batch():
    ix = torch.randint(len(tokens) - block, (batch_size,))
    return torch.stack([tokens[i:i + block] for i in ix]), torch.stack([tokens[i + 1:i + block + 1] for i in ix])


class CharModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(12, 12)

    def forward(self, idx, targets):
        logits = self.table(idx)
        return logits, F.cross_entropy(logits.view(-1, 12), targets.view(-1))


model = CharModel()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(6):
    xb, yb = get_batch()
    if step == 0:
        first = xb[:, 0].tolist()
    logits, loss = model(xb, yb)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
"""
# what each rank drew first and the weights it ends with, written by rank (appended to the converted script)
RECORD = """
import json
with open(f"rank{RANK}.json", "w") as record:
    json.dump([first, optimizer.param_groups[0]["params"][0].tolist()], record)
"""

SEEDED_IN_A_FUNCTION = GET_BATCH.replace("torch.manual_seed(7)\n", "").replace(
    "model = CharModel()\n", "def seed_all(seed):\n    torch.manual_seed(seed)\n\n\nseed_all(7)\nmodel = CharModel()\n")


def convert(text: str, batch_size: str = "per-gpu"):
    return convert_source(text, "ddp", batch_size=batch_size)


def test_each_rank_reseeds_with_its_rank_once_the_model_is_wrapped():
    result = convert(GET_BATCH)
    assert result.status is Status.CONVERTED, result.missing
    wrapped, reseeded, loop = (result.output.index(s) for s in ("model = DDP(", "torch.manual_seed(7 + RANK)\n", "for step in range(6):"))
    assert wrapped < reseeded < loop
    assert [c.transform for c in result.changes if "each rank draws its own batches" in c.message] == ["draws"]
    assert any("statistically, not exactly, equivalent" in a.message for a in result.advice)
    assert any("multiply AdamW's learning rate" in a.message for a in result.advice)  # the global batch grew


def test_the_global_batch_option_divides_the_offsets_each_rank_draws():
    result = convert(GET_BATCH, "global")
    assert result.status is Status.CONVERTED, result.missing
    assert "ix = torch.randint(len(tokens) - block, (batch_size // WORLD_SIZE,))" in result.output
    assert not any("learning rate" in a.message for a in result.advice)


def test_a_seed_set_in_another_function_is_moved_on_by_the_rank():
    """seed_all(seed)'s argument can't be named before training: torch's current seed plus the rank."""
    result = convert(SEEDED_IN_A_FUNCTION)
    assert result.status is Status.CONVERTED, result.missing
    assert "torch.manual_seed((torch.initial_seed() + RANK) % 2**64)\nfor step in range(6):" in result.output


def test_an_unseeded_script_draws_apart_already_and_gets_no_seed():
    result = convert(GET_BATCH.replace("torch.manual_seed(7)\n", ""))
    assert result.status is Status.CONVERTED, result.missing
    assert "RANK)" not in result.output.split("model = DDP(")[1].split("for step")[0]
    assert any("statistically, not exactly, equivalent" in a.message for a in result.advice)


def test_a_loss_of_this_file_keeps_the_rows_shared_exactly():
    """With the loss computed here, the ranks share each batch's rows (exact): no per-rank draws."""
    script = GET_BATCH.replace("return logits, F.cross_entropy(logits.view(-1, 12), targets.view(-1))", "return logits").replace(
        "logits, loss = model(xb, yb)", "logits = model(xb, yb)\n    loss = F.cross_entropy(logits.view(-1, 12), yb.view(-1))")
    result = convert(script)
    assert result.status is Status.CONVERTED, result.missing
    assert "loss_of_rank_rows(" in result.output and "+ RANK)" not in result.output


def test_on_two_ranks_each_draws_its_own_batches_and_the_parameters_agree(tmp_path: Path):
    (tmp_path / "lm.py").write_text(convert(GET_BATCH).output + RECORD)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "lm.py"]
    done = run_script(torchrun, tmp_path, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    (first_0, weights_0), (first_1, weights_1) = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first_0 != first_1  # each rank drew its own batch
    assert weights_0 == weights_1  # and DDP averaged their gradients


def test_verify_judges_the_per_rank_draws_statistically_equivalent(tmp_path: Path):
    (tmp_path / "lm.py").write_text(GET_BATCH)
    done = run_ddpify(["verify", "lm.py", "--to", "ddp", "--steps", "4", "--json"], tmp_path, timeout=300)
    result = json.loads(done.stdout)
    assert (result["verdict"], result["mode"]) == ("equivalent", "statistical"), result["message"]
    assert any("each rank draws its own batches" in note for note in result["notes"])


PROJECT = {
    "data.py": """
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_loader(batch_size):
    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
    return DataLoader(dataset, batch_size=batch_size, shuffle=True)
""",
    "solver.py": """
import torch
import torch.nn as nn


class Solver:
    def __init__(self, loader, steps):
        self.loader = loader
        self.steps = steps
        self.model = nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train(self):
        data_iter = iter(self.loader)
        for step in range(self.steps):
            try:
                x, y = next(data_iter)
            except StopIteration:
                data_iter = iter(self.loader)
                x, y = next(data_iter)
            loss = nn.functional.mse_loss(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            print(f"step {step} loss {loss.item():.4f}")
""",
    "main.py": """
import torch
from data import make_loader
from solver import Solver


def main():
    torch.manual_seed(0)
    loader = make_loader(8)
    Solver(loader, 10).train()


if __name__ == "__main__":
    main()
""",
}


@pytest.fixture
def step_loop_project(tmp_path: Path) -> Path:
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(text.lstrip())
    return tmp_path


def test_a_loader_whose_passes_another_file_restarts_needs_no_epoch_loop_here(step_loop_project: Path):
    done = run_ddpify(["convert", "main.py", "--to", "ddp", "--in-place"], step_loop_project)
    assert done.returncode == 0, done.stdout + done.stderr
    solver = (step_loop_project / "solver.py").read_text()
    assert "self.loader.sampler.set_epoch(self.loader.sampler.epoch + 1)" in solver
    assert "DistributedSampler(" in (step_loop_project / "data.py").read_text()
    assert "never told the epoch" not in done.stdout + done.stderr


def test_the_restarted_step_loop_runs_on_two_ranks(step_loop_project: Path):
    assert run_ddpify(["convert", "main.py", "--to", "ddp", "--in-place"], step_loop_project).returncode == 0
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "main.py"]
    done = run_script(torchrun, step_loop_project, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("step 9 loss") == 1, done.stdout  # printed on rank 0 only


SAMPLED = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

torch.manual_seed(0)
ds = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(ds, batch_size=4, sampler={sampler})
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
RANK_GENERATOR = "generator=torch.Generator().manual_seed((torch.initial_seed() + RANK) % 2**64)"


def test_a_sampler_with_replacement_draws_from_a_generator_of_each_rank():
    result = convert(SAMPLED.format(sampler="RandomSampler(ds, replacement=True, num_samples=64)"))
    assert result.status is Status.CONVERTED, result.missing
    flat = "".join(result.output.split())
    assert f"RandomSampler(ds,replacement=True,num_samples=64//WORLD_SIZE,{''.join(RANK_GENERATOR.split())},)" in flat
    assert any("statistically, not exactly, equivalent" in a.message for a in result.advice)


def test_without_num_samples_each_rank_draws_its_share_of_the_dataset_and_the_global_batch_is_kept():
    result = convert(SAMPLED.format(sampler="RandomSampler(ds, replacement=True)"), "global")
    assert result.status is Status.CONVERTED, result.missing
    assert "num_samples=len(ds) // WORLD_SIZE" in result.output and "batch_size=4 // WORLD_SIZE" in result.output


def test_a_sampler_without_replacement_or_with_its_own_generator_stays_incomplete():
    for sampler in ("RandomSampler(ds)", "RandomSampler(ds, replacement=True, generator=torch.Generator())"):
        result = convert(SAMPLED.format(sampler=sampler))
        assert result.status is Status.INCOMPLETE and "own sampler" in result.missing[0].what, sampler


TRAINER_PROJECT = {
    "model.py": """
import torch
import torch.nn as nn


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x, y):
        out = self.body(x)
        return out, nn.functional.mse_loss(out, y)

    def configure_optimizers(self, lr):
        decay = set()
        for name, module in self.named_modules():
            for pname, _ in module.named_parameters(recurse=False):
                if pname == "weight":
                    decay.add(f"{name}.{pname}")
        params = dict(self.named_parameters())
        groups = [{"params": [params[n] for n in sorted(decay)], "weight_decay": 0.01},
                  {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr)
""",
    "trainer.py": """
import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, model, dataset, steps):
        self.model = model
        self.dataset = dataset
        self.steps = steps

    def run(self):
        model = self.model
        self.optimizer = model.configure_optimizers(1e-2)
        loader = DataLoader(self.dataset, batch_size=4,
                            sampler=torch.utils.data.RandomSampler(self.dataset, replacement=True, num_samples=1000))
        data_iter = iter(loader)
        for step in range(self.steps):
            x, y = next(data_iter)
            if step == 0:
                self.first = x[:, 0].tolist()
            _, loss = model(x, y)
            model.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
""",
    "main.py": """
import torch
from torch.utils.data import TensorDataset
from model import Regressor
from trainer import Trainer

torch.manual_seed(3)
dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
model = Regressor()
trainer = Trainer(model, dataset, 5)
trainer.run()
""",
}
TRAINER_RECORD = """
import json
with open(f"rank{RANK}.json", "w") as record:
    json.dump([trainer.first, [p.tolist() for p in trainer.optimizer.param_groups[0]["params"]]], record)
"""


def test_a_trainer_of_another_file_wraps_the_model_it_is_handed_and_each_rank_samples_its_own(tmp_path: Path):
    for name, text in TRAINER_PROJECT.items():
        (tmp_path / name).write_text(text.lstrip())
    done = run_ddpify(["convert", "main.py", "--to", "ddp", "--in-place"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trainer = (tmp_path / "trainer.py").read_text()
    assert "model = DDP(" in trainer and "model.module.configure_optimizers(1e-2)" in trainer
    assert "num_samples=1000 // WORLD_SIZE" in trainer and RANK_GENERATOR in trainer
    (tmp_path / "main.py").write_text((tmp_path / "main.py").read_text() + TRAINER_RECORD)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "main.py"]
    ran = run_script(torchrun, tmp_path, timeout=RUN_TIMEOUT_S)
    assert ran.returncode == 0, ran.stderr[-2000:]
    (first_0, weights_0), (first_1, weights_1) = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first_0 != first_1 and weights_0 == weights_1


UNIFORM_GUESSES = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

torch.manual_seed(0)
ds = TensorDataset(torch.randn(256, 8), torch.randint(0, 50, (256,)))
model = nn.Linear(8, 50)
nn.init.zeros_(model.weight)  # every batch's loss starts at log(50): a loss that compares across batches
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(ds, batch_size=16, sampler=RandomSampler(ds, replacement=True))
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_verify_compares_samples_drawn_by_each_rank_statistically(tmp_path: Path):
    """The reference can't draw what each rank's generator draws: it keeps its own sampling (no re-cut
    as if by a DistributedSampler, which held the runs to exact equality and found them diverged)."""
    (tmp_path / "sampled.py").write_text(UNIFORM_GUESSES)
    done = run_ddpify(["verify", "sampled.py", "--to", "ddp", "--steps", "4", "--json"], tmp_path, timeout=300)
    result = json.loads(done.stdout)
    assert (result["verdict"], result["mode"]) == ("equivalent", "statistical"), result["message"]
    assert any("a RandomSampler with replacement, loader at sampled.py:11" in note for note in result["notes"]), result["notes"]
