"""A conversion raises the garbage collector's thresholds while it runs, and gives back the thresholds it found."""

import gc

import pytest

from ddpify.collector import FEWER_COLLECTIONS_THRESHOLDS
from ddpify.convert import convert_source

SCRIPT = """import torch
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in [torch.ones(4, 2)]:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
"""


def test_thresholds_raised_while_converting_and_restored_after(monkeypatch):
    seen = []
    real = gc.get_threshold
    monkeypatch.setattr("ddpify.convert.run_pipeline", _spying_pipeline(seen, real))
    before = gc.get_threshold()
    convert_source(SCRIPT, "ddp")
    assert seen and seen[0] == tuple(max(now, wanted) for now, wanted in zip(before, FEWER_COLLECTIONS_THRESHOLDS))
    assert seen[0] != before  # raised, from these thresholds (tests/conftest.py keeps the test process's below)
    assert gc.get_threshold() == before


def test_thresholds_restored_when_the_conversion_fails(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("ddpify.convert.run_pipeline", failing)
    before = gc.get_threshold()
    with pytest.raises(RuntimeError):
        convert_source(SCRIPT, "ddp")
    assert gc.get_threshold() == before


def _spying_pipeline(seen, threshold):
    from ddpify.codemods.pipeline import run_pipeline

    def spy(*args, **kwargs):
        seen.append(threshold())
        return run_pipeline(*args, **kwargs)

    return spy
