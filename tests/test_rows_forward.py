"""Full-batch rows whose forward works row by row: each rank runs the forward on its rows only (issue 24, class 1).

fixtures/rows/ holds an MLP regression on 101 `torch.linspace` rows (two ranks: 51 and 50), its output bound to
a name the loss alone reads, and a GRU-cell model over 7 sequences (4 and 3) trained with LBFGS through a closure
that prints every evaluation's loss. Converted, each runs under torchrun on 2 ranks (gloo) with every training
forward on the rank's rows only (a forward hook counts them), prints the single process's losses, and verifies
equivalent in exact mode. A forward that may mix rows stays whole on every rank, and the report says why.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source
from helpers import one_line, run_script
from test_full_batch import verify

ROWS_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rows"

# Runs a script counting the rows of every forward taken with gradients (training's, not evaluation's under
# no_grad), and leaves the most it saw in rows.<RANK> ("rows.single" without torchrun).
ROWS_SEEN = """
import os, runpy, sys, torch
seen = []
def count(module, args, output):
    if torch.is_grad_enabled() and args and torch.is_tensor(args[0]) and args[0].dim():
        seen.append(len(args[0]))
torch.nn.modules.module.register_module_forward_hook(count)
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
finally:
    with open(f"rows.{os.environ.get('RANK', 'single')}", "w") as out:
        out.write(str(max(seen, default=0)))
"""


@pytest.mark.parametrize("name, rows, forward", [
    ("mlp_linspace.py", {"single": 101, "0": 51, "1": 50}, "prediction = model(rows_of_rank(x))"),
    ("lbfgs_sequence.py", {"single": 7, "0": 4, "1": 3}, "out = model(rows_of_rank(inputs))"),
])
def test_a_row_wise_forward_runs_on_the_rows_of_each_rank_only(name, rows, forward, tmp_path):
    original = (ROWS_FIXTURES / name).read_text()
    result = convert_source(original, "ddp")
    assert result.status is Status.CONVERTED, result.missing
    assert forward in result.output
    assert any(c.transform == "rows" and "runs the forward on its rows" in c.message for c in result.changes)
    (tmp_path / "train.py").write_text(original)
    (tmp_path / "train_ddp.py").write_text(result.output)
    (tmp_path / "rows_seen.py").write_text(ROWS_SEEN)
    single = run_script([sys.executable, "rows_seen.py", "train.py"], tmp_path)
    ranks = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "rows_seen.py",
                        "train_ddp.py"], tmp_path, timeout=300)
    assert single.returncode == 0 and ranks.returncode == 0, ranks.stderr[-3000:]
    assert {rank: int((tmp_path / f"rows.{rank}").read_text()) for rank in rows} == rows
    assert _labels(ranks.stdout) == _labels(single.stdout)
    assert _numbers(ranks.stdout) == pytest.approx(_numbers(single.stdout), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", ["mlp_linspace.py", "lbfgs_sequence.py"])
def test_a_row_wise_forward_on_the_rows_of_each_rank_verifies_equivalent_exactly(name, tmp_path):
    (tmp_path / name).write_text((ROWS_FIXTURES / name).read_text())
    verdict = verify(tmp_path, name)
    assert (verdict["verdict"], verdict["mode"]) == ("equivalent", "exact"), verdict["message"]


SCRIPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = {layer}

    def forward(self, x):
        return {forward}


torch.manual_seed(0)
x = torch.randn(64, 4)
y = torch.randn(64, 1)
model = Net()
criterion = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    optimizer.zero_grad()
    out = model(x)
    loss = criterion(out, y)
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("layer, forward", [
    ("nn.Linear(4, 1)", "F.relu(self.layer(x)) * 2"),
    ("nn.Linear(4, 1)", "self.layer(x.view(x.size(0), -1)).softmax(dim=1)"),
    ("nn.Linear(4, 1)", "torch.cat([self.layer(x), self.layer(x)], dim=1).sum(1, keepdim=True)"),
    ("nn.Linear(8, 1)", "self.layer(torch.cat([x, torch.zeros(x.shape[0], 4)], 1))"),
    ("nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1))", "self.layer(x)"),
    ("nn.GRUCell(4, 1)", "self.layer(x, torch.zeros(len(x), 1))"),
])
def test_a_forward_that_works_row_by_row_runs_on_each_ranks_rows(layer, forward):
    result = convert_source(SCRIPT.format(layer=layer, forward=forward), "ddp")
    assert result.status is Status.CONVERTED, result.missing
    assert "out = model(rows_of_rank(x))" in result.output
    assert "loss = loss_of_rank_rows(criterion, out, rows_of_rank(y), rows=len(x))" in one_line(result.output)


@pytest.mark.parametrize("layer, forward, why", [
    ("nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))", "self.layer(x)",
     "`nn.BatchNorm1d(8)` (line 10) is no layer known to work row by row"),
    ("nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 1))", "self.layer(x)", "`nn.Dropout(0.1)` (line 10)"),
    ("nn.LSTM(4, 1)", "self.layer(x)", "takes its sequence's steps as rows (no batch_first=True)"),
    ("nn.Linear(4, 1)", "self.layer(x) - self.layer(x).mean()", "`self.layer(x).mean()` (line 13) in Net works across the rows"),
    ("nn.Linear(4, 1)", "self.layer(x).softmax(0)", "works across the rows (no constant dim other than 0)"),
    ("nn.Linear(4, 1)", "torch.sum(self.layer(x), 0, keepdim=True) + self.layer(x)", "works across the rows"),
    ("nn.Linear(4, 1)", "self.layer(x.view(64, -1))", "makes a shape whose first size is not the batch's rows"),
    ("nn.Linear(1, 1)", "self.layer(x.reshape(-1, 1))", "makes a shape whose first size is not the batch's rows"),
    ("nn.Linear(4, 1)", "self.layer(x) @ torch.ones(1, 1)", "multiplies matrices"),
    ("nn.Linear(4, 1)", "self.layer(x.t().t())", "`x.t().t()` (line 13) in Net is no operation known to work row by row"),
    ("nn.Linear(4, 1)", "self.layer(x[1:])", "indexes the rows"),
    ("nn.Linear(4, 1)", "self.layer(x) * torch.randn(1)", "`torch.randn(1)` (line 13) in Net is no operation known"),
])
def test_a_forward_that_may_mix_rows_runs_whole_on_every_rank_and_says_why(layer, forward, why):
    result = convert_source(SCRIPT.format(layer=layer, forward=forward), "ddp")
    assert result.status is Status.CONVERTED, result.missing
    assert "rows_of_rank(x)" not in result.output
    assert "loss = loss_of_rank_rows(criterion, out, y)" in one_line(result.output)
    (change,) = [c for c in result.changes if c.transform == "rows"]
    assert "every rank runs the forward on the whole batch: the forward may mix rows: " in change.message and why in change.message


@pytest.mark.parametrize("header, layer, why", [
    ("class Net(nn.Module, Mixin):", "nn.Linear(4, 1)", "Net derives from Mixin, which this file can't see work row by row"),
    ("class Net(nn.Module):", "models.resnet18()", "`self.layer(x)` (line 13) in Net calls a module this file can't see work row by row"),
])
def test_a_model_built_from_what_this_file_cant_see_runs_whole(header, layer, why):
    script = "from elsewhere import Mixin, models" + SCRIPT.format(layer=layer, forward="self.layer(x)").replace("class Net(nn.Module):", header)
    result = convert_source(script, "ddp")
    assert "rows_of_rank(x)" not in result.output
    (change,) = [c for c in result.changes if c.transform == "rows"]
    assert why in change.message


@pytest.mark.parametrize("training, why", [
    ("out = model(x)\n    loss = criterion(out, y)\n    print((out - y).abs().max().item())",
     "`out` is read besides the loss, where it would hold this rank's rows only"),
    ("out = model(x, x)\n    loss = criterion(out, y)", "`model(x, x)` takes more than one batch of rows"),
    ("out = model(x.clone())\n    loss = criterion(out, y)", "`model(x.clone())` computes its input in the call"),
    ("out = model(x)\n    loss = criterion(out[:32], y[:32])", "the loss takes `out[:32]`, rows picked from the forward's output"),
])
def test_a_forward_output_used_otherwise_stays_whole(training, why):
    script = SCRIPT.format(layer="nn.Linear(4, 1)", forward="self.layer(x)").replace(
        "out = model(x)\n    loss = criterion(out, y)", training).replace("def forward(self, x):", "def forward(self, x, *more):")
    result = convert_source(script, "ddp")
    assert result.status is Status.CONVERTED, result.missing
    assert "rows_of_rank(x)" not in result.output
    (change,) = [c for c in result.changes if c.transform == "rows"]
    assert why in change.message


def _labels(stdout: str) -> list[str]:
    return [re.sub(r"-?\d+\.\d+", "#", line) for line in stdout.splitlines()]


def _numbers(stdout: str) -> list[float]:
    return [float(n) for n in re.findall(r"-?\d+\.\d+", stdout)]
