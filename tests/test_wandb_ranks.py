"""A wandb run under DDP/FSDP/Accelerate: every rank starts it, the ranks other than 0 with
mode="disabled" (wandb's run that sends nothing, whose calls and config still work).

Guarded to rank 0, `wandb.init` left wandb's module state unset on the other ranks: their
`wandb.config.lr` and `wandb.log(...)` raise wandb.Error there (the job then hangs on rank 0's next
collective), and a stand-in for `run = wandb.init(...)` answered `run.config.lr` with itself (a
TypeError as a learning rate). Proven by running each conversion on 2 ranks (torchrun, gloo,
bounded by a timeout) against a fake wandb (tests/data/fake_wandb) that behaves as the real client
before init and in disabled mode, and records what each rank sends.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.output import output_kind
from ddpify.convert import convert_source
from helpers import failure_report, run_script

FAKE_WANDB = Path(__file__).resolve().parent / "data" / "fake_wandb" / "wandb"

TRAIN = textwrap.dedent("""\
    import torch
    import wandb
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        torch.manual_seed(0)
        {init}
        {config}.update({{"batch_size": 4}})
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr={config}.lr)
        {run}.watch(model)
        data = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
        loader = DataLoader(data, batch_size={config}.batch_size, shuffle=True)
        for epoch in range({config}.epochs):
            for x, y in loader:
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                {run}.log({{"loss": loss.item()}})
        print(f"trained {{{config}.epochs}} epochs of batch {{{config}.batch_size}}")
        {run}.finish()


    if __name__ == "__main__":
        main()
    """)
CONFIG = '{"lr": 0.1, "epochs": 2}'
# wandb's module state (`wandb.config`, `wandb.log`), and the run object a script keeps (its own mode rank 0's).
MODULE_STATE = TRAIN.format(init=f'wandb.init(project="demo", config={CONFIG})', config="wandb.config", run="wandb")
RUN_OBJECT = TRAIN.format(init=f'run = wandb.init(project="demo", config={CONFIG}, mode="online")', config="run.config",
                          run="run")
STEPS = 2 * 16 // 4 // 2  # epochs x batches a rank takes


def _run_converted(source: str, target: str, tmp_path: Path):
    result = convert_source(source, target)
    assert not result.missing, result.missing
    (tmp_path / "train.py").write_text(result.output)
    shutil.copytree(FAKE_WANDB, tmp_path / "wandb")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    run = run_script(torchrun, tmp_path, timeout=240)
    sent = [json.loads(line) for f in sorted(tmp_path.glob("sent-*.jsonl")) for line in f.read_text().splitlines()]
    return result.output, run, sent


@pytest.mark.parametrize("target", ["ddp", "fsdp", "accelerate"])
@pytest.mark.parametrize("source", [MODULE_STATE, RUN_OBJECT], ids=["wandb.config", "run.config"])
def test_every_rank_runs_to_the_end_and_rank_zero_alone_sends(source, target, tmp_path):
    output, run, sent = _run_converted(source, target, tmp_path)
    assert run.returncode == 0, failure_report(run)
    assert "trained 2 epochs of batch 4" in run.stdout
    assert {record["rank"] for record in sent} == {"0"}, sent
    kinds = [record["what"] for record in sent]
    assert kinds == ["init", "config", "watch", *["log"] * STEPS, "finish"], kinds


def test_a_mode_the_script_gives_is_rank_zeros():
    output = convert_source(RUN_OBJECT, "ddp").output
    assert 'mode=("online") if RANK == 0 else "disabled"' in output
    assert "RankZeroStandIn" not in output


def test_the_config_is_updated_on_every_rank_and_the_run_started_there():
    output = convert_source(MODULE_STATE, "ddp").output
    assert 'mode=None if RANK == 0 else "disabled"' in output
    assert '    wandb.config.update({"batch_size": 4})' in output
    assert "if RANK == 0:\n        wandb.watch(model)" in output


@pytest.mark.parametrize("call, is_output", [("wandb.config.update({'a': 1})", False), ("wandb.run.config.update({'a': 1})", False),
                                             ("wandb.init()", False), ("wandb.log({'a': 1})", True), ("wandb.watch(model)", True)])
def test_what_of_wandb_is_rank_zero_output(call, is_output):
    a = analyze(f"import wandb\n{call}\n")
    assert bool(output_kind(a, a.tree.body[-1].value)) is is_output


def test_attributes_a_disabled_run_holds_its_own_are_advised_where_every_rank_reads_them():
    read_by_all = convert_source(RUN_OBJECT.replace("    run.finish()", "    checkpoints = run.dir\n    run.finish()"), "ddp")
    assert [a.message for a in read_by_all.advice if "has its own dir, not rank 0's" in a.message], read_by_all.advice
    printed = convert_source(RUN_OBJECT.replace("    run.finish()", "    print(run.dir)\n    run.finish()"), "ddp")
    assert not [a.message for a in printed.advice if "has its own" in a.message], printed.advice


def test_settings_unpacked_into_init_are_left_to_the_user():
    """`wandb.init(**settings)` may already name a mode: adding one could raise TypeError, so it is advised."""
    result = convert_source(MODULE_STATE.replace(f'project="demo", config={CONFIG}', "**settings").replace(
        "def main():", f'settings = {{"project": "demo", "config": {CONFIG}}}\n\n\ndef main():'), "ddp")
    assert "wandb.init(**settings)" in result.output
    assert [a.message for a in result.advice if 'pass it mode="disabled" off rank 0 by hand' in a.message], result.advice
