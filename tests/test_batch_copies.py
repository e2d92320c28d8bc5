"""The conversion copies tensor batches to the GPU with `non_blocking=True` (issue 26).

A blocking copy waits for the kernels queued before it; on an H200 with two ranks sharing the GPU the
one fixture whose original copied non-blocking ran at par with the expert port and the others 9-32 %
slower (docs/performance.md, "On a GPU"). Only copies that are safe to make so change: tensors a loop
unpacks from a default-collated batch, going to the device the model is moved to.
"""

from __future__ import annotations

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.batch_copies import batch_copies
from ddpify.convert import convert_source

HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = DataLoader(data, batch_size=8, shuffle=True{loader_options})
model = nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for {target} in {walk}:
        {copy}
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def script(copy: str, target: str = "x, y", loader_options: str = "") -> str:
    walk = "enumerate(loader)" if target.startswith("i,") else "loader"
    return HEAD.format(copy=copy, target=target, walk=walk, loader_options=loader_options)


@pytest.mark.parametrize(("copy", "target"), [
    ("x, y = x.to(device), y.to(device)", "x, y"),
    ("x, y = x.cuda(), y.cuda()", "x, y"),
    ("x = x.to(device); y = y.to(device)", "i, (x, y)"),
    ("x, y = data[0].to(device), data[1].to(device)", "i, data"),
])
def test_copies_of_unpacked_tensors_to_the_models_device_do_not_block(copy: str, target: str) -> None:
    source = script(copy, target)
    assert len(batch_copies(analyze(source, "train.py"))) == 2
    output = convert_source(source, "ddp", path="train.py").output
    assert output.count("non_blocking=True") == 2
    assert convert_source(output, "ddp", path="train.py").output == output  # converting twice changes nothing


@pytest.mark.parametrize(("copy", "target", "loader_options", "why"), [
    ("x, y = batch; x, y = x.to(device), y.to(device)", "batch", "", "a whole batch: its .to may be the script's own"),
    ("x, y = x.to(device), y.to(device)", "x, y", ", collate_fn=lambda b: b", "a collate of its own"),
    ("x, y = x.to(torch.float16), y.to(device, dtype=torch.float16)", "x, y", "", "a cast, and a copy with options"),
    ('x, y = x.to("cpu"), y.to(other)', "x, y", "", "to a device the model is not moved to"),
    ("x, y = x.to(device, non_blocking=False), y.cuda(0)", "x, y", "", "already says how"),
    ('x, y = data["x"].to(device), data[i].to(device)', "i, data", "", "not a constant element"),
])
def test_other_copies_are_left_as_they_are(copy: str, target: str, loader_options: str, why: str) -> None:
    source = script(copy, target, loader_options).replace("device = torch", "other = device = torch")
    assert batch_copies(analyze(source, "train.py")) == (), why
    assert "non_blocking=True" not in convert_source(source, "ddp", path="train.py").output, why


def test_a_script_with_a_tokenizers_batches_keeps_its_copies() -> None:
    """A transformers BatchEncoding is a batch mapping whose `.to` took no non_blocking before 4.41."""
    source = "import transformers\n" + script("x, y = x.to(device), y.to(device)")
    assert batch_copies(analyze(source, "train.py")) == ()
