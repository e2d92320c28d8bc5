"""A model with BatchNorm that only rank-0 output runs (a print's evaluation, without model.eval()).

On GPUs the conversion makes its BatchNorm layers SyncBatchNorm, whose forward in training mode
all-gathers statistics from every rank: rank 0 running it alone, even through `model.module`, waits
for ranks that never join (or pairs with their next collective). Such a call runs on every rank
first, the print on rank 0. Proven on 2 CPU ranks (gloo) with a stand-in that makes each BatchNorm
forward in training mode a collective, as SyncBatchNorm's is on GPUs; before, the collectives
mismatched and gloo aborted.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from ddpify.convert import convert_source
from helpers import failure_report, run_script


# BatchNorm evaluated in training mode from a print (the evaluation never calls model.eval()).
BATCHNORM = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        torch.manual_seed(0)
        loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))), batch_size=8, shuffle=True)
        model = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def score():
            with torch.no_grad():
                return model(torch.ones(4, 8)).mean().item()

        for epoch in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            print(f"epoch {epoch} score {score():.4f}")


    if __name__ == "__main__":
        main()
    """)
# SyncBatchNorm runs on GPUs only (DDP refuses it on CPU): this stand-in makes every BatchNorm forward
# in training mode a collective, as SyncBatchNorm's all-gather of statistics is on GPUs.
SYNC_BATCHNORM_ON_CPU = textwrap.dedent("""\
    import torch
    import torch.distributed as dist
    from torch.nn.modules.batchnorm import _BatchNorm

    _local_forward = _BatchNorm.forward


    def _gathering_forward(self, x):
        if self.training and dist.is_initialized():
            dist.all_reduce(torch.zeros(1))
        return _local_forward(self, x)


    _BatchNorm.forward = _gathering_forward
    """)


def test_a_model_with_batchnorm_runs_on_every_rank_where_only_a_print_calls_it(tmp_path: Path):
    result = convert_source(BATCHNORM, "ddp")
    assert not result.missing, result.missing
    assert "        score_result = score()\n        if RANK == 0:\n" in result.output
    (tmp_path / "train.py").write_text(SYNC_BATCHNORM_ON_CPU + result.output)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    run = run_script(torchrun, tmp_path, timeout=180)
    assert run.returncode == 0, failure_report(run)
    assert [line.split(" score")[0] for line in run.stdout.splitlines()] == ["epoch 0", "epoch 1"]
