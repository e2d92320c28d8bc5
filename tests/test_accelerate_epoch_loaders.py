"""`--to accelerate` with a DataLoader built anew inside the epoch loop (issue 27).

A freshly prepared loader is at its epoch 0 (its seedable sampler shuffles with torch's initial seed plus
the epoch), so a loader prepared anew every epoch repeated epoch 0's shuffle in every epoch, while the
original reshuffles each epoch; verify's reference mirrored that port (each new loader counted its passes
from 0) and called it equivalent. The conversion now tells the loader the epoch after its prepare, and the
reference numbers such a loader's passes as the epoch loop counts them. Runs: 2 processes, gloo, a timeout.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import FIXTURES_DIR, failure_report, run_ddpify, run_script  # noqa: E402

CURRICULUM = FIXTURES_DIR / "loader_in_epoch_loop.py"
INLINE = FIXTURES_DIR / "inline_loaders" / "shuffled_with_eval.py"
TOLD = "set_epoch(epoch)\n"

# Each epoch rebuilds a shuffled loader over the same 16 samples and prints the order it draws them in.
ORDERS = textwrap.dedent("""\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.arange(16).float().unsqueeze(1))
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        loader = DataLoader(data, batch_size=4, shuffle=True)
        seen = []
        for (x,) in loader:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += x.flatten().int().tolist()
        print(f"epoch {epoch} order {seen}")
""")
ORDER = re.compile(r"^epoch (\d) order (\[.*\])$", re.MULTILINE)


def converted(text: str, path: str) -> str:
    result = convert_source(text, "accelerate", path=path)
    assert not result.missing, [m.what for m in result.missing]
    return result.output


def test_a_loader_built_each_epoch_is_told_the_epoch_after_its_prepare():
    output = converted(CURRICULUM.read_text(), CURRICULUM.name)
    assert "        loader = accelerator.prepare(loader)\n        loader.set_epoch(epoch)\n" in output, output


def test_an_inline_loader_of_each_epoch_is_named_prepared_and_told_the_epoch():
    output = converted(INLINE.read_text(), INLINE.name)
    assert ("    train_loader = accelerator.prepare(\n"
            "        DataLoader(TensorDataset(features, targets), batch_size=8, shuffle=True),\n"
            "    )\n"
            "    train_loader.set_epoch(epoch)\n"
            "    for step, (x, y) in enumerate(train_loader):\n") in output, output


def test_a_loader_built_once_is_not_told_an_epoch():
    """Prepared once, its own count of completed passes reshuffles it each epoch."""
    once = ORDERS.replace("    loader = DataLoader(data, batch_size=4, shuffle=True)\n", "")
    once = once.replace("optimizer = torch.optim.SGD(", "loader = DataLoader(data, batch_size=4, shuffle=True)\noptimizer = torch.optim.SGD(")
    assert "set_epoch" not in converted(once, "once.py")


def test_the_converted_loader_reshuffles_every_epoch_on_two_processes(tmp_path):
    script = tmp_path / "orders.py"
    script.write_text(converted(ORDERS, script.name))
    run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                     cwd=tmp_path, timeout=240)
    assert run.returncode == 0, failure_report(run)
    orders = dict(ORDER.findall(run.stdout))
    assert sorted(orders) == ["0", "1", "2"], run.stdout
    assert len(set(orders.values())) == 3, run.stdout  # before: epoch 0's order in every epoch


def verify(folder: Path, script: str, *args: str) -> dict:
    done = run_ddpify(["verify", script, "--to", "accelerate", "--json", "--timeout", "200", *args], folder, timeout=300)
    assert done.stdout.startswith("{"), failure_report(done)
    return json.loads(done.stdout)


@pytest.fixture
def curriculum(tmp_path) -> Path:
    shutil.copy(CURRICULUM, tmp_path)
    return tmp_path


def test_the_conversion_verifies_equivalent_over_every_epoch(curriculum):
    """14 steps: 2 + 4 + 8 over the 32, 64 and 128 samples of the three epochs."""
    result = verify(curriculum, CURRICULUM.name, "--steps", "14")
    assert (result["verdict"], len(result["steps"])) == ("equivalent", 14), result["message"]


def test_a_port_that_repeats_epoch_0s_shuffle_diverges_in_epoch_1(curriculum):
    port = converted(CURRICULUM.read_text(), CURRICULUM.name)
    assert TOLD in port
    (curriculum / "port.py").write_text(port.replace(f"        loader.{TOLD}", ""))
    result = verify(curriculum, CURRICULUM.name, "--against", "port.py", "--steps", "6")
    assert (result["verdict"], result["diverged_at"]) == ("diverged", 3), result["message"]  # epoch 1's first step
