"""`ddpify convert --to dp` on every fixture: snapshots, idempotence, formatting, and real runs.

Snapshots live in fixtures/expected/dp/<fixture>.py. After an intended change to the codemod,
regenerate them with `DDPIFY_UPDATE_SNAPSHOTS=1 pytest tests/test_dp_codemod.py -k snapshot`
and read the diff before committing it.

The converted scripts run on CPU, where `nn.DataParallel` just calls the wrapped module: they
must print exactly what the original prints (bit-for-bit training) and write the same
checkpoints, with keys that load into the original model class (no `module.` prefix).
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import os
import sys
import tokenize
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from ddpify.codemods.dp import DP_TRANSFORMS, MeanLoss
from ddpify.codemods.options import Options
from ddpify.codemods.pipeline import Status, run_pipeline
from ddpify.convert import convert_source

try:
    from helpers import FIXTURES_DIR, failure_report, python_argv, run_script
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import FIXTURES_DIR, failure_report, python_argv, run_script

EXPECTED_DIR = FIXTURES_DIR / "expected" / "dp"
FIXTURES = sorted(p for p in FIXTURES_DIR.glob("*.py") if p.is_file())
IDS = [p.name for p in FIXTURES]
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")


@functools.lru_cache(maxsize=None)
def convert(path: Path):
    return convert_source(path.read_text(), "dp", path=path.name)


# ----- snapshots -------------------------------------------------------------------------------
def test_every_fixture_has_a_snapshot():
    assert sorted(p.name for p in EXPECTED_DIR.glob("*.py")) == IDS


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_snapshot(script: Path):
    expected = EXPECTED_DIR / script.name
    output = convert(script).output
    if os.environ.get("DDPIFY_UPDATE_SNAPSHOTS"):
        expected.write_text(output)
    assert output == expected.read_text()


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_converting_again_changes_nothing(script: Path):
    converted = EXPECTED_DIR / script.name
    again = convert_source(converted.read_text(), "dp", path=script.name)
    assert again.output == converted.read_text()
    assert not again.changes


# ----- formatting --------------------------------------------------------------------------------
def changed_statement_lines(source: str, change_lines: set[int]) -> set[int]:
    """Lines of the simple statements (not blocks) that a reported change points into."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and not hasattr(node, "body"):
            span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            if change_lines & set(span):
                lines.update(span)
    return lines


def comments(source: str) -> Counter:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return Counter(tok.string for tok in tokens if tok.type == tokenize.COMMENT)


def docstrings(source: str) -> list[str | None]:
    nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))]
    return [ast.get_docstring(n, clean=False) for n in nodes]


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_only_changed_statements_differ(script: Path):
    source = script.read_text()
    result = convert(script)
    allowed = changed_statement_lines(source, {c.line for c in result.changes})
    old, new = source.splitlines(), result.output.splitlines()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            untouched = [n for n in range(i1 + 1, i2 + 1) if n not in allowed]
            assert not untouched, f"lines {untouched} changed but no change was reported there"
    assert comments(source) <= comments(result.output)
    assert docstrings(source) == docstrings(result.output)


# ----- running them ----------------------------------------------------------------------------
def run_in(script: Path, cwd: Path):
    cwd.mkdir()
    return run_script(python_argv(script), cwd=cwd, timeout=120)


def state_dicts(obj, where: str = "") -> dict[str, dict[str, torch.Tensor]]:
    """Every dict of tensors inside a checkpoint (the model's state dict, also under "model")."""
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return {where: obj}
    found: dict[str, dict[str, torch.Tensor]] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            found.update(state_dicts(value, f"{where}/{key}"))
    return found


def assert_same_checkpoint(original: Path, converted: Path):
    before = state_dicts(torch.load(original, map_location="cpu"))
    after = state_dicts(torch.load(converted, map_location="cpu"))
    assert before.keys() == after.keys(), converted.name
    for where, state in after.items():
        assert list(state) == list(before[where]), f"{converted.name}{where}: keys differ (a `module.` prefix?)"
        for key, tensor in state.items():
            assert torch.equal(tensor, before[where][key]), f"{converted.name}{where}: {key} differs"


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_converted_script_runs_like_the_original(script: Path, tmp_path: Path):
    with ThreadPoolExecutor(2) as pool:
        original = pool.submit(run_in, script, tmp_path / "original")
        converted = pool.submit(run_in, EXPECTED_DIR / script.name, tmp_path / "converted")
        original, converted = original.result(), converted.result()
    assert original.returncode == 0, failure_report(original)
    assert converted.returncode == 0, failure_report(converted)
    assert converted.stdout == original.stdout
    written = sorted(p.name for p in (tmp_path / "converted").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "original").iterdir())
    for name in written:
        if name.endswith(CHECKPOINT_SUFFIXES):
            assert_same_checkpoint(tmp_path / "original" / name, tmp_path / "converted" / name)


# ----- several GPUs, simulated -------------------------------------------------------------------
# Without GPUs DataParallel calls the module once, so a loss returned by forward stays a scalar and
# the runs above can't tell whether the converted script averages it. This sitecustomize makes
# nn.DataParallel behave like two GPUs on CPU with the simulation `verify --to dp` uses (see
# ddpify/verify/dataparallel.py): scatter, replicas, gather (scalars become one value per replica).
TWO_REPLICAS = "from ddpify.verify.dataparallel import simulate_data_parallel\nsimulate_data_parallel(2)\n"
LOSS_FIXTURES = [p for p in FIXTURES if any(c.transform == MeanLoss.NAME for c in convert(p).changes)]


def run_with_two_replicas(script: Path, tmp_path: Path):
    site = tmp_path / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(TWO_REPLICAS)
    path = os.pathsep.join([str(site), str(FIXTURES_DIR.parent)])  # ddpify from this checkout
    return run_script(python_argv(script), cwd=site, env_extra={"PYTHONPATH": path}, timeout=120)


def test_loss_fixtures_are_there():
    assert {p.name for p in LOSS_FIXTURES} >= {"forward_returns_loss.py", "dp_loss_tuple.py", "dp_loss_dict.py"}


@pytest.mark.parametrize("script", LOSS_FIXTURES, ids=[p.name for p in LOSS_FIXTURES])
def test_loss_from_forward_survives_two_replicas(script: Path, tmp_path: Path):
    without_mean = tuple(t for t in DP_TRANSFORMS if t is not MeanLoss)
    unaveraged = tmp_path / f"unaveraged_{script.name}"
    unaveraged.write_text(run_pipeline(script.read_text(), script.name, without_mean, Options()).output)
    with ThreadPoolExecutor(2) as pool:
        converted = pool.submit(run_with_two_replicas, EXPECTED_DIR / script.name, tmp_path / "converted")
        control = pool.submit(run_with_two_replicas, unaveraged, tmp_path / "control")
        converted, control = converted.result(), control.result()
    assert converted.returncode == 0, failure_report(converted)
    assert control.returncode != 0 and "scalar" in control.stderr, "the simulation must catch an unaveraged loss"


# ----- a forward on the whole data ---------------------------------------------------------------
SAMPLES_BY_MASK = """
import torch
import torch.nn as nn

x = torch.randn(100, 8)
y = torch.randint(0, 3, (100,))
train_mask = torch.arange(100) % 2 == 0
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3)).cuda()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(10):
    optimizer.zero_grad()
    out = model(x)
    loss = criterion(out[train_mask], y[train_mask])
    loss.backward()
    optimizer.step()
"""


def test_a_graph_forward_on_the_whole_data_is_not_split_by_dataparallel():
    """graph_node_masks.py runs `adj @ self.first(features)` on all 90 nodes and trains on the rows of a mask:
    DataParallel would hand each GPU half the adjacency's rows and half the features (a crash on 2 GPUs, shapes
    45x90 and 45x16), so the model stays unwrapped and the conversion says why and what to do."""
    script = FIXTURES_DIR / "graph_node_masks.py"
    result = convert(script)
    assert result.status is Status.INCOMPLETE and "DataParallel" not in result.output
    [missing] = result.missing
    assert script.read_text().splitlines()[missing.line - 1].strip() == "out = model(features, adj)"
    assert "model is not wrapped in nn.DataParallel" in missing.what and "`adj @ self.second(hidden)` (line 20)" in missing.what
    assert "--to ddp" in missing.todo and "one GPU" in missing.todo


def test_samples_picked_by_a_mask_through_batchnorm_and_dropout_are_still_split():
    """Whole data and a mask too, but only BatchNorm and Dropout keep the forward from working row by row: its rows
    are samples, which DataParallel splits as it splits a loader's batch."""
    result = convert_source(SAMPLES_BY_MASK, "dp")
    assert result.status is Status.CONVERTED and "model = nn.DataParallel(model)" in result.output, result.missing
