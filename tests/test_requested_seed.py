"""A script that asks for runs that repeat (a `--seed` option nothing reads) and seeds torch nowhere:
its multi-GPU output would earn DDP024 (missing-seed), as any such multi-GPU script does, so the
conversion seeds every RNG before the model (ddpify.codemods.ddp.seeds), where the lint fix would.
The unseeded original drew other numbers at every run: the seed takes nothing away from it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_script  # noqa: E402

RUN_TIMEOUT_S = 120

UNUSED_SEED_OPTION = '''
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    data = TensorDataset(torch.linspace(-1, 1, 256).reshape(64, 4), torch.linspace(0, 1, 64).reshape(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(epoch, round(loss.item(), 6))


if __name__ == "__main__":
    main()
'''
NO_SIGN_OF_CARE = UNUSED_SEED_OPTION.replace('    parser.add_argument("--seed", type=int, default=1)\n', "")


@pytest.mark.parametrize("target", ["ddp", "dp"])
def test_a_script_asking_for_repeatable_runs_is_seeded_before_its_model(target: str):
    """DataParallel's output is linted by DDP024 too; with no distributed helpers, the seed's helper follows the imports."""
    result = convert_source(UNUSED_SEED_OPTION, target, path="train.py")
    assert result.status is Status.CONVERTED, result.missing
    assert "    seed_everything(0)\n    model = nn.Sequential(" in result.output
    assert "def seed_everything(seed):" in result.output


def test_a_script_that_shows_no_care_is_left_unseeded():
    """DDP025, off by default, speaks for those: the conversion adds nothing."""
    result = convert_source(NO_SIGN_OF_CARE, "ddp", path="train.py")
    assert result.status is Status.CONVERTED, result.missing
    assert "seed_everything" not in result.output


def test_the_seeded_output_repeats_its_runs_where_the_original_does_not(tmp_path: Path):
    """Two plain runs of each (world size 1), each with its generators seeded from the OS as a fresh
    interpreter's are (the fork server does that too): the original's dropout and shuffle differ run to
    run, the converted script's print the same; on 2 ranks it finishes."""
    runs = {}
    for name, text in (("original", UNUSED_SEED_OPTION), ("converted", convert_source(UNUSED_SEED_OPTION, "ddp").output)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(text)
        outputs = [run_script([sys.executable, "train.py"], tmp_path / name, timeout=RUN_TIMEOUT_S) for _ in range(2)]
        assert all(done.returncode == 0 for done in outputs), outputs[0].stderr
        runs[name] = outputs[0].stdout == outputs[1].stdout
    assert runs == {"original": False, "converted": True}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    assert run_script(torchrun, tmp_path / "converted", timeout=RUN_TIMEOUT_S).returncode == 0
