"""The wrap goes after every cast of the model's parameters to another dtype (brief A9).

DDP builds its gradient buckets in the dtype the parameters have when it wraps them: wrapped before
`model.double()`, float64 gradients were all-reduced through float32 buckets (pytorch/examples'
time_sequence_prediction: loss 0.00332 against the original's 0.00154 after 20 LBFGS evaluations).
The conversion of FLOAT64 is run on 2 gloo ranks by `ddpify verify`: equivalent, exact; the
conversion as it was (wrap, then `model.module.double()`) diverges at the first step. FSDP2's
fully_shard casts its shards with the model: a cast in its training loop trains exactly alike.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VERIFY_TIMEOUT_S = 240

FLOAT64 = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return self.body(x)


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.randn(64, 8, dtype=torch.float64)
y = torch.randn(64, 1, dtype=torch.float64)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model = Net()
model.to(device)
model.double()
criterion = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
"""
WRAP = re.compile(r"^model = DDP\(\n(?:    .*\n)*\)\n", re.MULTILINE)


def converted(text: str, target: str = "ddp"):
    return convert_source(text, target, path="train.py")


def wrap_line(output: str, wrap: str) -> int:
    """The line of the first statement that wraps `model` (`model = DDP(`, `fully_shard(model`, `accelerator.prepare(model`)."""
    return next(i for i, line in enumerate(output.splitlines()) if wrap in line)


def line_of(output: str, code: str) -> int:
    return next(i for i, line in enumerate(output.splitlines()) if line.strip() == code)


def verify(tmp_path: Path, script: str, *args: str) -> dict:
    """`ddpify verify --json train.py ARGS` of `script` on 2 gloo ranks, bounded by a timeout."""
    (tmp_path / "train.py").write_text(script)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    completed = run_ddpify(["verify", "--json", "train.py", "--nproc", "2", *args], tmp_path, env, VERIFY_TIMEOUT_S)
    return json.loads(completed.stdout)


@pytest.mark.parametrize("cast", ["model.double()", "model.to(torch.float64)", "model.to(device, dtype=torch.double)",
                                  "model.type(torch.float64)", "model = model.double()"])
def test_the_ddp_wrap_follows_the_cast(cast):
    result = converted(FLOAT64.replace("model.double()", cast))
    assert result.missing == []
    assert line_of(result.output, cast) < wrap_line(result.output, "model = DDP(")
    assert ".module." not in result.output


@pytest.mark.parametrize(("target", "wrap", "cast"), [
    ("fsdp", "fully_shard(model", "model.double()"),
    ("accelerate", "accelerator.prepare(model", "accelerator.unwrap_model(model).double()"),  # the model itself, unprepared
])
def test_the_shard_and_the_prepare_follow_the_cast(target, wrap, cast):
    result = converted(FLOAT64, target)
    assert result.missing == []
    assert line_of(result.output, cast) < wrap_line(result.output, wrap)


def cast_in_the_loop(cast: str = "model.double()") -> str:
    return FLOAT64.replace("model.double()\n", "").replace("    for inputs", f"    {cast}\n    for inputs")


@pytest.mark.parametrize("target", ["ddp", "accelerate"])
@pytest.mark.parametrize("cast", ["model.double()", "model.to(device, torch.float64)"])
def test_a_cast_in_the_training_loop_leaves_the_conversion_incomplete(target, cast):
    text = cast_in_the_loop(cast)
    missing = converted(text, target).missing
    assert [m.line for m in missing] == [line_of(text, cast) + 1]
    assert "dtype after it is wrapped" in missing[0].what


def test_fully_shard_follows_a_cast_in_the_training_loop(tmp_path):
    """FSDP2 casts its shards with the model: the conversion is complete, and trains exactly alike."""
    assert converted(cast_in_the_loop(), "fsdp").missing == []
    result = verify(tmp_path, cast_in_the_loop(), "--to", "fsdp")
    assert (result["verdict"], result["mode"]) == ("equivalent", "exact"), result["message"]


def test_a_cast_once_training_is_over_is_left_to_the_wrapper():
    text = FLOAT64 + "model.half()\ntorch.save(model.state_dict(), 'half.pt')\n"
    result = converted(text)
    assert result.missing == []
    assert "model.module.half()" in result.output


def test_a_move_in_the_training_loop_is_no_cast():
    text = FLOAT64.replace("    for inputs", "    model.to(device)\n    for inputs")
    assert converted(text).missing == []


def test_the_conversion_of_a_float64_model_trains_exactly_like_the_original(tmp_path):
    result = verify(tmp_path, FLOAT64, "--to", "ddp")
    assert (result["verdict"], result["mode"]) == ("equivalent", "exact"), result["message"]


def test_the_wrap_before_the_cast_diverges(tmp_path):
    """The conversion as it was: wrapped, then `model.module.double()`: float64 gradients reduced in float32 buckets."""
    output = converted(FLOAT64).output
    wrap = WRAP.search(output).group(0)
    wrong = output.replace("\nmodel.double()\n", "\n", 1).replace(wrap, wrap + "model.module.double()\n")
    assert wrong != output
    (tmp_path / "wrong.py").write_text(wrong)
    result = verify(tmp_path, FLOAT64, "--to", "ddp", "--against", "wrong.py")
    assert (result["verdict"], result["diverged_at"]) == ("diverged", 1), result["message"]
