"""A DataLoader written inline in the epoch loop (`for x, y in DataLoader(ds, shuffle=True)`): the
training loader is named before the pass with its DistributedSampler (its shuffle moved into the
sampler) and told the epoch; one that never shuffles is sharded in place. The loader stays built
in the epoch loop, as in the original (its arguments may change per epoch). Before, the named
loader lost its sampler: DDP005 left the conversion incomplete, and --partial's output crashed
under torchrun on `RandomSampler.set_epoch`. Fixtures: fixtures/inline_loaders/."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import FIXTURES_DIR, failure_report, run_ddpify, run_script  # noqa: E402

INLINE = FIXTURES_DIR / "inline_loaders"
STEP = re.compile(r"^epoch (\d+) step (\d+) ", re.MULTILINE)


def converted(name: str, to: str, batch_size: str = "per-gpu") -> str:
    result = convert_source((INLINE / f"{name}.py").read_text(), to, path=f"{name}.py", batch_size=batch_size)
    assert not result.missing, [m.what for m in result.missing]
    return result.output


@pytest.mark.parametrize("to", ["ddp", "fsdp"])
def test_an_inline_shuffled_loader_is_named_with_its_sampler_and_told_the_epoch(to):
    output = converted("shuffled_with_eval", to)
    assert ("    train_loader = DataLoader(\n"
            "        train_dataset := TensorDataset(features, targets),\n"
            "        batch_size=8,\n"
            "        sampler=DistributedSampler(train_dataset, shuffle=True),\n"
            "    )\n"
            "    train_loader.sampler.set_epoch(epoch)\n"
            "    for step, (x, y) in enumerate(train_loader):\n") in output, output


def test_an_inline_evaluation_loader_is_not_given_the_training_sampler():
    output = converted("shuffled_with_eval", "ddp")
    evaluation = output[output.index("model.eval()"):]
    assert "DistributedSampler" not in evaluation and "set_epoch" not in evaluation, evaluation


def test_an_inline_unshuffled_loader_is_sharded_in_place_without_set_epoch():
    output = converted("unshuffled", "ddp")
    assert "set_epoch" not in output
    assert "    for step, (x, y) in enumerate(\n        DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=False)),\n" in output, output


def test_a_shuffle_and_batch_size_passed_by_position_are_taken_as_such():
    """`DataLoader(dataset, 16, True)`: the positional shuffle gives way to the sampler (a DataLoader takes
    not both), and --batch-size global divides the positional batch size."""
    output = converted("positional_options", "ddp", batch_size="global")
    assert ("    train_loader = DataLoader(\n        dataset,\n        16 // WORLD_SIZE,\n"
            "        sampler=DistributedSampler(dataset, shuffle=True),\n    )\n") in output, output


@pytest.mark.parametrize("name, to, batch_size", [("shuffled_with_eval", "ddp", "per-gpu"), ("unshuffled", "ddp", "per-gpu"),
                                                  ("shuffled_with_eval", "fsdp", "per-gpu"), ("shuffled_with_eval", "accelerate", "per-gpu"),
                                                  ("positional_options", "ddp", "global")])
def test_the_converted_inline_loaders_run_on_two_ranks(name, to, batch_size, tmp_path):
    """Each rank trains on its half: 64 samples / 2 ranks / batch 8 = steps 0..3 of each of the 3 epochs, logged once."""
    script = tmp_path / f"{name}_{to}.py"
    script.write_text(converted(name, to, batch_size))
    run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                     cwd=tmp_path, timeout=240)
    assert run.returncode == 0, failure_report(run)
    assert sorted(STEP.findall(run.stdout)) == [(str(e), str(s)) for e in range(3) for s in range(4)], run.stdout


@pytest.mark.parametrize("name, batch_size", [("shuffled_with_eval", "per-gpu"), ("positional_options", "global")])
def test_the_inline_shuffled_loaders_verify_across_epochs(name, batch_size, tmp_path):
    """12 steps: all three epochs, each reshuffled by set_epoch as the reference mirrors it."""
    shutil.copy(INLINE / f"{name}.py", tmp_path)
    proc = run_ddpify(["verify", f"{name}.py", "--to", "ddp", "--batch-size", batch_size, "--steps", "12", "--json", "--timeout", "200"],
                      tmp_path, timeout=300)
    assert json.loads(proc.stdout)["verdict"] == "equivalent", failure_report(proc)
