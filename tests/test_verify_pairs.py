"""verify on a loss that pairs the batch's rows with each other, which DDP cannot split exactly.

A pull-away term (an energy-based GAN's, gan-zoo-ebgan's) or a contrastive loss multiplies the batch's
embeddings with each other (`unit @ unit.t()`): a term over every pair of rows. Under DDP each rank pairs its
own rows only, so the mean of the ranks' terms misses the pairs across ranks and is not the whole batch's: no
conversion that keeps the term per rank can match the reference exactly. At 6eb7cdf verify compared such a
script exactly and said `diverged at step 1`; it now compares it statistically and names the product as the
reason, while a port that gathers every rank's rows for the term (torch.distributed.nn's all_gather, whose
backward returns each rank its rows' gradient) matches exactly and is still compared exactly.

Each test runs `ddpify verify --to ddp` (2 ranks, gloo) on a script written here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ddpify.verify.aligned_draws import TrainingBatch
from ddpify.verify.harness import _watched_product
from ddpify.verify.plan import PAIRS_FLAG
from ddpify.verify.recorder import Recorder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_verify_noise import verify, wrong_port  # noqa: E402

# A model that returns its embedding beside its output, for a loss term on the embeddings (here and in
# tests/test_batch_pairs.py).
EMBEDDING_NET = """class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(4, 16), nn.Tanh())
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        embedding = self.embed(x)
        return self.head(embedding), embedding
"""
PULL_AWAY = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


""" + EMBEDDING_NET + """

def pull_away(embeddings):
    unit = embeddings / embeddings.norm(dim=1, keepdim=True)
    rows = embeddings.size(0)
    return ((unit @ unit.t()).sum() - rows) / (rows * (rows - 1))


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in loader:
            prediction, embedding = model(xb)
            loss = nn.functional.mse_loss(prediction, yb) + 0.5 * pull_away(embedding)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_a_term_over_pairs_of_rows_is_compared_statistically_with_its_reason(tmp_path):
    result = verify(tmp_path, PULL_AWAY)
    assert result["verdict"] == "equivalent", result["message"]
    assert result["mode"] == "statistical", result["notes"]
    assert any("pairs the batch's rows" in note and "matmul in pull_away() at" in note for note in result["notes"]), result["notes"]


def test_a_port_gathering_every_ranks_rows_for_the_term_is_compared_exactly(tmp_path):
    gathered = "pull_away(torch.cat(torch.distributed.nn.functional.all_gather(embedding)))"
    port = wrong_port(tmp_path, PULL_AWAY, "pull_away(embedding)", gathered)
    (tmp_path / port).write_text("import torch.distributed.nn.functional\n" + (tmp_path / port).read_text())
    result = verify(tmp_path, PULL_AWAY, "--against", port)
    assert result["verdict"] == "equivalent", result["message"]
    assert result["mode"] == "exact", result["notes"]


ROWS = 4
WEIGHT = torch.nn.Parameter(torch.randn(ROWS, 3))  # a layer with as many outputs as the batch has rows


@pytest.mark.parametrize("operands, grad, pairs", [
    (lambda x: (x, x.t()), True, True),  # the rows by each other
    (lambda x: (x, x.t()), False, False),  # no gradient: a metric, not a loss term
    (lambda x: (x, WEIGHT.t()), True, False),  # the rows by a parameter's: a layer
    (lambda x: (x, torch.cat([x, x]).t()), True, False),  # the rows by every rank's (gathered)
])
def test_a_product_is_flagged_where_it_pairs_a_ranks_rows_with_each_other(monkeypatch, tmp_path, operands, grad, pairs):
    monkeypatch.setattr(TrainingBatch, "rows", ROWS)
    recorder = Recorder(str(tmp_path / "record.pt"), 1)
    x = torch.randn(ROWS, 3, requires_grad=True)
    with torch.set_grad_enabled(grad):
        _watched_product(torch.matmul, recorder)(*operands(x))
    assert (PAIRS_FLAG in recorder.flags) == pairs, recorder.flags
