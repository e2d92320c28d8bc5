"""The DDP wrap's options come from the analysis (issue 26): gradient_as_bucket_view where no .grad is
written and no two wrapped models share parameters, broadcast_buffers=False where the buffers are
constants, each with its comment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.ddp_options import buffers_need_no_broadcast, shares_parameters, writes_gradients
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import failure_report, run_script  # noqa: E402

SCRIPT = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.register_buffer("mask", torch.ones(2))
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        return self.fc(x) * self.mask


def main():
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 2)), batch_size=4, shuffle=True)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    print("done")


if __name__ == "__main__":
    main()
"""


def model_of(text: str):
    a = analyze(text, "train.py")
    (model,) = a.trained_models
    return a, model


def test_constant_buffers_need_no_broadcast_and_untouched_gradients_stay_in_the_buckets() -> None:
    a, model = model_of(SCRIPT)
    assert buffers_need_no_broadcast(a, model)
    assert not writes_gradients(a)


@pytest.mark.parametrize("write", [
    "        self.seen += 1\n", "        self.seen.add_(1)\n", "        self.mask[0] = 2.0\n", "        self.seen = self.seen + 1\n",
])
def test_a_buffer_the_forward_writes_keeps_the_broadcast(write: str) -> None:
    text = SCRIPT.replace("        return self.fc(x) * self.mask\n", write + "        return self.fc(x) * self.mask\n")
    a, model = model_of(text)
    assert not buffers_need_no_broadcast(a, model)


def test_a_model_without_buffers_is_given_no_broadcast_option() -> None:
    """DDP copies nothing for it anyway, and torch 2.13 warns that broadcast_buffers is deprecated."""
    a, model = model_of(SCRIPT.replace('        self.register_buffer("mask", torch.ones(2))\n', "").replace(
        '        self.register_buffer("seen", torch.zeros(()))\n', "").replace(" * self.mask", ""))
    assert not buffers_need_no_broadcast(a, model)


def test_batchnorm_keeps_the_broadcast() -> None:
    a, model = model_of(SCRIPT.replace("self.fc = nn.Linear(4, 2)", "self.fc = nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2))"))
    assert not buffers_need_no_broadcast(a, model)


@pytest.mark.parametrize("write", [
    "        for p in model.parameters():\n            p.grad = p.grad * 0.5\n",
    "        for p in model.parameters():\n            p.grad.detach_()\n",
    "        for p in model.parameters():\n            del p.grad\n",
])
def test_a_script_that_writes_gradients_copies_them(write: str) -> None:
    a, _ = model_of(SCRIPT.replace("        optimizer.step()\n", write + "        optimizer.step()\n"))
    assert writes_gradients(a)


def test_the_wrap_says_why_it_chose_each_option() -> None:
    output = convert_source(SCRIPT, "ddp", path="train.py").output
    wrap = output[output.index("    # ddpify: gradient_as_bucket_view"):output.index("optimizer = ")]
    assert "gradient_as_bucket_view=True,\n" in wrap and "broadcast_buffers=False,\n" in wrap
    assert "# ddpify: broadcast_buffers=False: this model's buffers are constants" in wrap


def test_a_script_that_writes_gradients_gets_the_default_wrap() -> None:
    text = SCRIPT.replace("        optimizer.step()\n", "        for p in model.parameters():\n            p.grad = None\n        optimizer.step()\n")
    text = text.replace("self.fc = nn.Linear(4, 2)", "self.fc = nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2))")
    output = convert_source(text, "ddp", path="train.py").output
    assert "gradient_as_bucket_view" not in output and "broadcast_buffers" not in output


COMPILED = Path(__file__).resolve().parents[1] / "bench" / "overhead_fixtures" / "compiled_mlp.py"


@pytest.mark.parametrize("target, wrap", [("ddp", "model = DDP("), ("fsdp", "fully_shard(model)")])
def test_a_model_compiled_where_it_is_bound_is_wrapped_before_the_compile(target: str, wrap: str) -> None:
    output = convert_source(COMPILED.read_text(), target, path=str(COMPILED)).output
    assert output.index(wrap) < output.index("    model = torch.compile(model)\n")
    assert "# ddpify: wrapped before torch.compile" in output


def test_a_model_moved_after_its_compile_is_wrapped_after_the_move() -> None:
    text = COMPILED.read_text().replace("    model = Classifier().to(device)\n    model = torch.compile(model)\n",
                                        "    model = torch.compile(Classifier())\n    model.to(device)\n")
    output = convert_source(text, "ddp", path="train.py").output
    assert output.index("model.to(device)") < output.index("model = DDP(") and "wrapped before torch.compile" not in output


SHARED_BLOCKS = Path(__file__).resolve().parent / "data" / "shared_blocks.py"


def sharing(text: str) -> dict[str, bool]:
    a = analyze(text, "train.py")
    return {model.target.name: shares_parameters(a, model) for model in a.trained_models}


def test_a_block_handed_to_two_trained_models_shares_their_parameters() -> None:
    assert sharing(SHARED_BLOCKS.read_text()) == {"first": True, "second": True}


@pytest.mark.parametrize("handed", ["(4, 8)", "torch.device(device)", "int(8)"])
def test_a_value_that_is_no_module_handed_to_both_shares_nothing(handed: str) -> None:
    text = SHARED_BLOCKS.read_text().replace("    shared = nn.Linear(8, 2)\n", f"    shared = {handed}\n")
    assert sharing(text) == {"first": False, "second": False}


def test_a_trained_model_handed_to_another_trained_model_shares_its_parameters() -> None:
    text = SHARED_BLOCKS.read_text().replace("first = Encoder(shared)", "first = Encoder(nn.Linear(8, 4))")
    text = text.replace("    second = Encoder(shared).to(device)\n", "    second = nn.Sequential(first, nn.Linear(4, 4)).to(device)\n")
    assert sharing(text) == {"first": True, "second": True}


def test_models_that_share_a_block_train_on_two_ranks_without_gradient_views(tmp_path: Path) -> None:
    """Two wrappers would each point the shared block's gradients at their own buckets: the second backward
    failed with 'parameter gradient is not the expected DDP bucket view' (gan-zoo-unit)."""
    output = convert_source(SHARED_BLOCKS.read_text(), "ddp", path=SHARED_BLOCKS.name).output
    (tmp_path / SHARED_BLOCKS.name).write_text(output)
    run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", SHARED_BLOCKS.name],
                     cwd=tmp_path, timeout=240)
    assert run.returncode == 0, failure_report(run)
    assert run.stdout.count("epoch 1 loss") == 1
    assert "gradient_as_bucket_view" not in output
