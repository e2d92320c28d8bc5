"""Sharded evaluation prints exactly the single-GPU metric, under torchrun with 2 and 3 ranks.

Every fixture with an evaluation loop is converted twice: `--eval shard` (each rank evaluates a
contiguous run of whole batches; the sums are all-reduced) and `--eval whole` (every rank evaluates
the full set, as the single-GPU script does). Both train identically, so rank 0 must print the same
lines, metric lines included, byte for byte; ranks that took a decision on a different metric
(ReduceLROnPlateau, early stopping in eval_odd_size.py, whose 101 validation samples no world size
divides) would train differently or hang.

To keep this to one torchrun launch per world size, a driver runs all the converted scripts in turn
in the same ranks (one process group, joined once; the scripts' own setup finds it joined).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.evaluation import evaluation_loops, loss_prints, shardable
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import FIXTURES_DIR, failure_report, run_script  # noqa: E402

EVAL_FIXTURES = sorted(p for p in FIXTURES_DIR.glob("*.py") if evaluation_loops(analyze(p.read_text(), str(p))))
MODES = ("shard", "whole")
TIMEOUT = 240

DRIVER = """
import contextlib, gc, json, os, runpy, sys
import torch.distributed as dist

dist.init_process_group("gloo")
destroy, dist.destroy_process_group = dist.destroy_process_group, lambda *args, **kwargs: None
for run_dir in json.load(open(sys.argv[1])):
    os.chdir(run_dir)
    with open(f"stdout.rank{os.environ['RANK']}", "w") as out, contextlib.redirect_stdout(out):
        runpy.run_path("script.py", run_name="__main__")
gc.collect()  # the scripts' DDP wrappers hold the group: it must shut down here, not at exit
destroy()
"""


def test_the_fixtures_with_evaluation_loops_are_all_sharded():
    names = [p.name for p in EVAL_FIXTURES]
    assert {"validation_accuracy.py", "two_loaders.py", "eval_only_after_train.py", "helper_functions.py", "eval_odd_size.py"} <= set(names)
    for script in EVAL_FIXTURES:
        anatomy = analyze(script.read_text(), str(script))
        loaders, loops = shardable(anatomy)
        assert loaders and len(loops) == len(evaluation_loops(anatomy)), script.name


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_evaluation_prints_the_whole_set_metric(world_size: int, tmp_path: Path):
    run_dirs = []
    for script in EVAL_FIXTURES:
        for mode in MODES:
            run_dir = tmp_path / f"{script.stem}-{mode}"
            run_dir.mkdir()
            (run_dir / "script.py").write_text(convert_source(script.read_text(), "ddp", path=str(script), eval=mode).output)
            run_dirs.append(str(run_dir))
    (tmp_path / "runs.json").write_text(json.dumps(run_dirs))
    (tmp_path / "driver.py").write_text(DRIVER)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
            str(tmp_path / "driver.py"), str(tmp_path / "runs.json")]
    result = run_script(argv, cwd=tmp_path, timeout=TIMEOUT)
    assert result.returncode == 0, failure_report(result)
    for script in EVAL_FIXTURES:
        shard, whole = (tmp_path / f"{script.stem}-{mode}" for mode in MODES)
        printed = (shard / "stdout.rank0").read_text()
        assert any(word in printed for word in ("val", "test")), f"{script.name} printed no metric:\n{printed}"
        assert printed == (whole / "stdout.rank0").read_text(), f"{script.name}: sharded evaluation printed other lines"
        assert all((shard / f"stdout.rank{r}").read_text() == "" for r in range(1, world_size))


def test_eval_whole_leaves_the_loaders_alone_with_advice():
    script = FIXTURES_DIR / "two_loaders.py"
    result = convert_source(script.read_text(), "ddp", eval="whole")
    assert "sampler=evaluation_shard" not in result.output and "= all_reduce_sums(loss_sum" not in result.output
    assert any("--eval whole" in a.message for a in result.advice)


def test_an_unrecognised_accumulation_stays_whole_with_the_reason():
    script = """import torch
from torch.utils.data import DataLoader, TensorDataset
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
for x, y in DataLoader(data, batch_size=4, shuffle=True):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
val_loader = DataLoader(data, batch_size=4)
best = 0.0
with torch.no_grad():
    for x, y in val_loader:
        best = max(best, model(x).max().item())
print(best)
"""
    result = convert_source(script, "ddp")
    assert "sampler=evaluation_shard" not in result.output
    assert any("`best` is computed in the loop" in a.message for a in result.advice)


def test_a_sum_carried_over_epochs_is_not_reduced_twice():
    """Zeroed outside the epoch loop, the sum would be all-reduced again each epoch: left whole."""
    source = (FIXTURES_DIR / "validation_accuracy.py").read_text()
    moved = source.replace("        correct = 0\n", "").replace("    val_acc = 0.0\n", "    val_acc = 0.0\n    correct = 0\n")
    assert moved != source
    anatomy = analyze(moved)
    assert shardable(anatomy) == ([], [])


def test_training_loss_prints_are_averaged_at_print_time_only():
    source = (FIXTURES_DIR / "validation_accuracy.py").read_text()
    reduced = convert_source(source, "ddp").output
    assert "loss_avg = mean_over_ranks(loss)" in reduced and "{loss_avg.item():.6f}" in reduced
    step_loop = reduced.split("for step, (x, y) in enumerate(train_loader):")[1].split("# --- validation ---")[0]
    assert step_loop.index("if step % 4 == 0:") < step_loop.index("mean_over_ranks"), "reduced on every step"
    rank0 = convert_source(source, "ddp", log_loss="rank0").output
    assert "mean_over_ranks" not in rank0 and "{loss.item():.6f}" in rank0


def test_a_print_under_a_rank_dependent_condition_is_not_reduced():
    """A collective under `if loss < ...` could run on some ranks only: left as rank 0's loss."""
    source = (FIXTURES_DIR / "validation_accuracy.py").read_text().replace("if step % 4 == 0:", "if loss.item() < 2.0:")
    assert not loss_prints(analyze(source))
    tree = ast.parse(convert_source(source, "ddp").output)
    assert "mean_over_ranks" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
