"""`ddpify verify` end to end: hand-written ports (correct and with planted bugs) and every fixture.

Each test runs `python -m ddpify verify` as a subprocess with a timeout; verify itself
runs the scripts, so these tests take seconds each.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify  # noqa: E402

from ddpify.verify.diagnose import SLOW_START  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).resolve().parent / "verify_cases"
FIXTURES = sorted((ROOT / "fixtures").glob("*.py"))
SUBPROCESS_TIMEOUT_S = 180


def cuda_available() -> bool:
    torch = pytest.importorskip("torch")
    return torch.cuda.is_available()


def converter_available() -> bool:
    try:
        import ddpify.convert  # noqa: F401
    except ImportError:
        return False
    return True


def run_verify(*args: str, timeout: float = SUBPROCESS_TIMEOUT_S, real: bool = False) -> subprocess.CompletedProcess:
    """`python -m ddpify verify ARGS` in the cases directory, ddpify importable from this checkout:
    forked from the tests' fork server (with its launcher), or a `real` process tree."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if real:
        return subprocess.run([sys.executable, "-m", "ddpify", "verify", *args], cwd=CASES, env={**os.environ, **env},
                              capture_output=True, text=True, timeout=timeout)
    return run_ddpify(["verify", *args], CASES, env, timeout)


def verify_json(*args: str, real: bool = False) -> tuple[int, dict]:
    """Exit code and parsed --json verdict; the logs a failed pair keeps are removed."""
    completed = run_verify("--json", *args, real=real)
    result = json.loads(completed.stdout)
    for note in result["notes"]:
        if note.startswith("logs kept in "):
            shutil.rmtree(note.removeprefix("logs kept in "), ignore_errors=True)
    return completed.returncode, result


def verify_against_edited_snapshot(tmp_path: Path, fixture: str, target: str, old: str, new: str) -> tuple[int, dict]:
    """Verify a fixture against its converted snapshot with `old` replaced by `new` (a deliberately wrong port)."""
    port = (ROOT / "fixtures" / "expected" / target / f"{fixture}.py").read_text()
    wrong = port.replace(old, new)
    assert wrong != port
    (tmp_path / f"{fixture}_wrong.py").write_text(wrong)
    return verify_json(str(ROOT / "fixtures" / f"{fixture}.py"), "--to", target, "--against", str(tmp_path / f"{fixture}_wrong.py"))


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (a workspace path)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


def test_correct_ddp_port_is_equivalent():
    completed = run_verify("train.py", "--to", "ddp", "--against", "train_ddp.py")
    lines = completed.stdout.strip().splitlines()
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert lines[-1].startswith("equivalent: 8 steps match")
    assert any(line.split()[:2] == ["step", "loss"] for line in lines)
    assert any("dropout" in line and "switched off" in line for line in lines)


def test_correct_ddp_port_is_equivalent_under_torchrun():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "train_ddp.py", "--launcher", "torchrun")
    assert (code, result["verdict"]) == (0, "equivalent"), result["message"]
    assert len(result["steps"]) == 8


def test_json_output_has_per_step_entries():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "train_ddp.py", "--steps", "5")
    assert code == 0
    assert [row["step"] for row in result["steps"]] == [1, 2, 3, 4, 5]
    row = result["steps"][0]
    assert row["ranks_agree"] is True
    assert row["max_rel_param"] <= 1e-5 and row["rel_loss"] <= 1e-5
    assert row["loss_reference"] == pytest.approx(row["loss_candidate"], rel=1e-5)


def test_plot_draws_the_per_step_figures_that_json_reports(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "curves.png"
    code, result = verify_json("train.py", "--to", "ddp", "--against", "train_ddp.py", "--steps", "3", "--plot", str(path))
    assert code == 0, result["message"]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]
    drawn = ("loss_reference", "loss_candidate", "update_rel_param", "max_rel_param")
    assert all(isinstance(row[key], float) for row in result["steps"] for key in drawn)
    assert result["tolerances"] == {"rel_loss": 1e-5, "max_rel_param": 1e-5, "update_rel_param": 1e-2}


def test_port_without_distributed_sampler_diverges_at_step_1():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "ddp_no_sampler.py")
    assert (code, result["diverged_at"]) == (1, 1), result["message"]
    assert result["message"].startswith("diverged at step 1")


def test_port_keeping_the_global_batch_per_rank_diverges_at_step_1():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "train_ddp.py", "--batch-size", "global")
    assert (code, result["diverged_at"]) == (1, 1), result["message"]


def test_port_splitting_the_global_batch_is_equivalent():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "ddp_split_batch.py", "--batch-size", "global")
    assert (code, result["verdict"]) == (0, "equivalent"), result["message"]


def test_port_missing_set_epoch_diverges_at_the_first_step_of_epoch_2():
    # 64 samples / (2 ranks x batch 8) = 4 steps per epoch: epoch 2 starts at step 5
    code, result = verify_json("train.py", "--to", "ddp", "--against", "ddp_no_set_epoch.py")
    assert (code, result["diverged_at"]) == (1, 5), result["message"]
    assert all(not row["problems"] for row in result["steps"][:4])


def test_sum_reduction_is_reported_as_a_precondition():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "train_ddp.py", "--", "--reduction", "sum")
    assert (code, result["verdict"]) == (1, "diverged")
    assert "precondition" in result["message"]
    assert any("reduction='sum'" in found and "2x smaller" in found for found in result["preconditions"])


SUMMED_LOSS = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
criterion = nn.MSELoss(reduction="sum")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
"""


def test_ddpifys_conversion_of_a_summed_loss_scales_it_and_is_equivalent(tmp_path):
    (tmp_path / "summed.py").write_text(SUMMED_LOSS)
    code, result = verify_json(str(tmp_path / "summed.py"), "--to", "ddp")
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]
    assert result["preconditions"] == []  # the scaled loss held nothing back


def test_plain_batchnorm_port_is_compared_exactly_with_the_reference_normalizing_each_ranks_part():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "train_ddp.py", "--", "--batchnorm")
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]
    assert any(note.startswith("plain BatchNorm1d: the reference normalizes each rank's part") for note in result["notes"])


def test_plain_batchnorm_port_with_a_wrong_learning_rate_diverges_exactly(tmp_path):
    """A 2% larger learning rate: within the 5% that statistical mode allowed plain BatchNorm."""
    code, result = verify_against_edited_snapshot(tmp_path, "batchnorm_cnn", "ddp", "lr=0.05,", "lr=0.051,")
    assert (code, result["verdict"], result["mode"], result["diverged_at"]) == (1, "diverged", "exact", 1), result["message"]


def test_dataparallel_port_is_equivalent_with_simulated_replicas():
    code, result = verify_json("train.py", "--to", "dp", "--against", "train_dp.py")
    assert (code, result["verdict"]) == (0, "equivalent"), result["message"]
    assert result["dataparallel"] == {"replicas": 2, "simulated": True}  # --device cpu hides any GPU
    assert any(note.startswith("DataParallel simulated with 2 replicas") for note in result["notes"])


DP_FIXTURES = {"forward_returns_loss": "exact", "dp_loss_tuple": "exact", "dp_loss_dict": "exact",
               "dp_device_in_forward": "exact", "batchnorm_cnn": "exact"}  # the reference normalizes each chunk too


@pytest.mark.skipif(not converter_available(), reason="ddpify.convert is not available yet")
@pytest.mark.parametrize("name", DP_FIXTURES)
def test_dp_conversion_trains_like_the_original_on_simulated_replicas(name):
    code, result = verify_json(str(ROOT / "fixtures" / f"{name}.py"), "--to", "dp")
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", DP_FIXTURES[name]), result["message"]
    assert result["dataparallel"]["simulated"]


def test_dp_port_that_does_not_average_the_loss_from_forward_fails_with_the_reason(tmp_path):
    """Without simulated replicas this port trains exactly like the original: the loss stays a scalar."""
    code, result = verify_against_edited_snapshot(
        tmp_path, "dp_loss_tuple", "dp", "            loss = loss.mean()  # DataParallel returns one loss per GPU\n", "")
    assert (code, result["verdict"]) == (2, "error")
    assert "only for scalar outputs" in result["message"] and "loss.mean()" in result["message"], result["message"]


def test_a_port_that_wraps_before_the_move_is_caught_on_cpu(tmp_path):
    """On CPU the late move changes nothing and the losses match; on GPUs DDP would be built on CPU parameters."""
    snapshot = (ROOT / "fixtures" / "expected" / "ddp" / "basic_main.py").read_text()
    moved = snapshot.index("    model.to(device)\n") + len("    model.to(device)\n")
    wrap = snapshot[moved:snapshot.index("    )\n", moved) + len("    )\n")]  # the options' comments and the wrap
    code, result = verify_against_edited_snapshot(tmp_path, "basic_main", "ddp", "    model.to(device)\n" + wrap, wrap + "    model.to(device)\n")
    assert (code, result["verdict"]) == (1, "diverged"), result["message"]
    assert result["message"].startswith("wrapped before its move: DistributedDataParallel.to(...) at basic_main_wrong.py:")


def test_crashing_rank_is_named_with_its_error():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "ddp_rank1_crash.py")
    assert (code, result["verdict"]) == (2, "error")
    assert result["message"] == "could not run: rank 1 failed: RuntimeError: planted failure on rank 1"


def test_the_rendezvous_port_cannot_be_taken_once_chosen():
    """The launcher's store binds as the OS picks its port: nothing can occupy it before the ranks connect."""
    pytest.importorskip("torch")
    from ddpify.verify.rendezvous import HOST, serve_store

    store = serve_store(2)
    with socket.socket() as squatter, pytest.raises(OSError) as refused:
        squatter.bind((HOST, store.port))
    assert refused.value.errno == errno.EADDRINUSE


def test_concurrent_verifies_each_rendezvous_on_their_own_port():
    """Verifies started together (as parallel test runs start them) all run: no candidate's ranks lose
    their port to another's, or join another's store. (Forked: the fork server runs launches side by side.)"""
    args = ("train.py", "--to", "ddp", "--against", "train_ddp.py", "--steps", "2")
    with ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(lambda _: verify_json(*args), range(3)))
    assert [(code, result["verdict"]) for code, result in outcomes] == [(0, "equivalent")] * 3, \
        [result["message"] for _, result in outcomes]


def rank0_alone_in_a_barrier_is_reported_without_orphans(launcher: str, timeouts_s: tuple[int, ...]) -> None:
    """The first of `timeouts_s` after which the ranks were past their start-up (a slow start, reported as
    one, is tried again with the next) reports rank 0's line; no process of any try is left."""
    for hang_s in timeouts_s:
        started = time.monotonic()
        completed = run_verify("train.py", "--to", "ddp", "--against", "ddp_rank0_barrier.py", "--timeout", str(hang_s),
                               "--launcher", launcher, "--json", timeout=90, real=True)  # real processes: orphans show
        elapsed = time.monotonic() - started
        result = json.loads(completed.stdout)
        workspace = next(note.removeprefix("logs kept in ") for note in result["notes"] if note.startswith("logs kept"))
        time.sleep(0.5)  # parent-death signals are asynchronous
        assert processes_mentioning(workspace) == []
        shutil.rmtree(workspace)
        if SLOW_START not in result["message"]:
            break
    assert completed.returncode == 2
    assert re.search(rf"rank 0 hung for {hang_s} s at ddp_rank0_barrier\.py:\d+ in main", result["message"]), result["message"]
    assert elapsed < hang_s + 40  # the timeout, plus start-up on a busy machine


def an_all_reduce_one_rank_never_joins_is_reported_with_each_ranks_stack() -> None:
    """Rank 0 waits in an all_reduce, rank 1 for the checkpoint rank 0 would save after it."""
    completed = run_verify("train.py", "--to", "ddp", "--against", "ddp_rank0_all_reduce.py", "--timeout", "5")
    shutil.rmtree(re.search(r"logs kept in (\S+)", completed.stdout)[1])
    lines = completed.stdout.splitlines()
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert re.fullmatch(r"could not run: rank 0 hung for 5 s at ddp_rank0_all_reduce\.py:\d+ in main `dist\.all_reduce\(torch\.ones\(1\)\)"
                        r"  # BUG: rank 1 never joins this collective`, waiting in all_reduce \(torch/distributed/distributed_c10d\.py:\d+\); "
                        r"rank 1 hung for 5 s at ddp_rank0_all_reduce\.py:\d+ in main (`time\.sleep\(0\.05\)`"
                        r"|`while not os\.path\.exists\(\"checkpoint\.pt\"\):`, waiting in exists \(.*\))", lines[-1]), lines[-1]
    stacks = lines[lines.index("rank 0 hung here (innermost first):"):-1]
    functions = [line.split(" in ")[-1].split(" `")[0] for line in stacks if line.startswith("  ")]
    rank1_polls = ["exists"] if "waiting in exists" in lines[-1] else []  # sampled in either line of its polling loop
    assert functions == ["all_reduce", "main", "<module>", *rank1_polls, "main", "<module>"], stacks
    assert "rank 1 hung here (innermost first):" in stacks


# verify's hang reports, run side by side with the others by tests/test_hang_reports.py. The ranks the launcher forks
# start at once (it imported torch); torchrun's import torch, and torch._dynamo as the script builds its DDP wrap,
# slower on a busy machine: they were past that within 5 s even beside two busy loops, and a slower start is
# tried again at 20 s.
HANG_REPORTS = {
    "rank 0 alone in a barrier, forked ranks": lambda: rank0_alone_in_a_barrier_is_reported_without_orphans("fork", (6,)),
    "rank 0 alone in a barrier, torchrun": lambda: rank0_alone_in_a_barrier_is_reported_without_orphans("torchrun", (8, 20)),
    "an all_reduce rank 1 never joins": an_all_reduce_one_rank_never_joins_is_reported_with_each_ranks_stack,
}


def test_a_rank_that_gloo_aborts_on_a_collective_mismatch_is_named_with_its_line_and_last_words():
    """Rank 0 dies of SIGABRT without a traceback; rank 1 then fails with 'Connection reset by peer': rank 0 died first."""
    code, result = verify_json("train.py", "--to", "ddp", "--against", "ddp_collective_mismatch.py", "--timeout", "60")
    assert (code, result["verdict"]) == (2, "error")
    assert re.fullmatch(r"could not run: rank 0 died of SIGABRT at ddp_collective_mismatch\.py:\d+ in main "
                        r"`dist\.all_reduce\(torch\.ones\(1\)\)  # BUG: rank 1 runs another collective`, waiting in all_reduce "
                        r"\(torch/distributed/distributed_c10d\.py:\d+\): what\(\): .*collective mismatch.*", result["message"]), \
        result["message"]


def test_a_candidate_whose_wrapper_never_ran_a_forward_is_not_converted():
    """The original against itself: its steps match the reference's, but nothing DataParallel was run."""
    code, result = verify_json("train.py", "--to", "dp", "--against", "train.py")
    assert (code, result["verdict"]) == (3, "not_converted"), result["message"]
    assert result["message"].startswith("not converted: the candidate never ran a forward through nn.DataParallel")
    assert len(result["steps"]) == 8 and all(not row["problems"] for row in result["steps"])


def test_a_failed_run_is_named_by_its_exception_line_not_the_end_of_a_long_message():
    pytest.importorskip("numpy")
    code, result = verify_json("numpy_int_alias.py", "--to", "ddp", "--timeout", "60")
    assert (code, result["verdict"]) == (2, "error")
    assert result["message"] == "could not run: reference failed: AttributeError: module 'numpy' has no attribute 'int'."


@pytest.mark.skipif(not cuda_available(), reason="needs CUDA")
def test_correct_ddp_port_is_equivalent_on_cuda():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "train_ddp.py", "--device", "cuda")
    assert (code, result["verdict"]) == (0, "equivalent"), result["message"]


@pytest.mark.skipif(cuda_available(), reason="checks the message shown when CUDA is absent")
def test_cuda_device_without_cuda_is_a_clean_error():
    code, result = verify_json("train.py", "--to", "ddp", "--against", "train_ddp.py", "--device", "cuda")
    assert (code, result["verdict"]) == (2, "error")
    assert "CUDA" in result["message"]


CONVERTER_BUGS: dict[str, str] = {}  # fixture stem -> the converter bug verify catches there (none today)


def fixture_param(path: Path):
    marks = []
    if path.stem in CONVERTER_BUGS:
        marks.append(pytest.mark.xfail(strict=True, reason=f"verify catches a converter bug: {CONVERTER_BUGS[path.stem]}"))
    return pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.skipif(not converter_available(), reason="ddpify.convert is not available yet")
@pytest.mark.parametrize("fixture", [fixture_param(path) for path in FIXTURES])
def test_converted_fixture_trains_like_the_original(fixture):
    code, result = verify_json(str(fixture), "--to", "ddp")
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]


def test_attention_dropout_is_switched_off_and_adam_noise_is_not_a_divergence():
    code, result = verify_json("attention_dropout.py", "--to", "ddp")
    assert (code, result["verdict"]) == (0, "equivalent"), result["message"]
    assert any("attention dropout" in note and "switched off" in note for note in result["notes"])


USER_SCRIPT = """
import os, sys
import torch
from torch.utils.data import DataLoader, TensorDataset

assert not os.path.isabs(sys.argv[0]) and sys.argv[0].startswith("train"), sys.argv[0]
x, y = torch.load("data/points.pt")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for xb, yb in DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(xb), yb).backward()
    optimizer.step()
torch.save(model.state_dict(), "ckpt.pt")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "next_to_script.txt"), "w") as f:
    f.write("done")
"""


def test_scripts_run_in_a_private_copy_of_the_working_directory(tmp_path):
    (tmp_path / "data").mkdir()
    torch = pytest.importorskip("torch")
    torch.save((torch.randn(16, 4), torch.randn(16, 1)), tmp_path / "data" / "points.pt")
    (tmp_path / "train.py").write_text(USER_SCRIPT)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = run_ddpify(["verify", "train.py", "--to", "ddp", "--steps", "2", "--json"], tmp_path, env, SUBPROCESS_TIMEOUT_S)
    result = json.loads(completed.stdout)
    assert (completed.returncode, result["verdict"]) == (0, "equivalent"), result["message"]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before, "verify wrote into the user's tree"



def test_random_augmentation_in_getitem_is_seeded_per_sample():
    """Its draws, alike in both runs, are no training randomness: the comparison stays exact."""
    code, result = verify_json("augmented_dataset.py", "--to", "ddp")
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]
    assert any("seed them by sample index and epoch" in note for note in result["notes"])


def test_a_batch_size_written_into_a_shape_breaks_the_re_cut_reference_and_says_so_in_one_line():
    """`x.reshape(8, -1)` cannot take the reference's 2 ranks x batch, and verify cannot set a literal:
    it names that, not a traceback (a batch size it can set: tests/test_verify_global_batch.py)."""
    code, result = verify_json("literal_batch.py", "--to", "ddp", "--steps", "2")
    assert (code, result["verdict"]) == (2, "error")
    assert result["message"].startswith("could not run: the reference failed on the batches verify re-cut for it "
                                        "(2 ranks x batch 8 = 16 samples a step from the loader at literal_batch.py:14), "
                                        "where no rank failed, at literal_batch.py:20 `loss = ")
    assert "\n" not in result["message"] and "write it from the batch (x.size(0))" in result["message"]


def test_batches_drawn_from_unseeded_numpy_verify_exactly_against_the_conversion_that_seeds_it():
    """The converter seeds numpy with 0 where the data is drawn from it unseeded; the reference starts from the same seed."""
    code, result = verify_json("numpy_drawn_batches.py", "--to", "ddp")
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]


def test_a_port_of_numpy_drawn_batches_that_forgot_the_seed_diverges(tmp_path):
    converted = run_ddpify(["convert", str(CASES / "numpy_drawn_batches.py"), "--to", "ddp", "-o", "-"], CASES, {}, SUBPROCESS_TIMEOUT_S)
    assert converted.returncode == 0 and "np.random.seed(0)\n" in converted.stdout, converted.stdout
    (tmp_path / "unseeded_ddp.py").write_text(converted.stdout.replace("np.random.seed(0)\n", ""))
    code, result = verify_json("numpy_drawn_batches.py", "--to", "ddp", "--against", str(tmp_path / "unseeded_ddp.py"))
    assert (code, result["verdict"]) == (1, "diverged"), result["message"]


PACKAGE_TRAINER = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


def train(epochs=2):
    model = torch.nn.Linear(4, 1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    for epoch in range(epochs):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
'''


def test_a_package_imported_through_a_relative_pythonpath_is_each_sides_own(tmp_path):
    """minGPT's layout: `PYTHONPATH=. python projects/demo/run.py`, the trainer in a package at the root
    (converted in the candidate's mirror): both sides import it from their own mirror, not the launcher's folder."""
    (tmp_path / "tinypkg").mkdir()
    (tmp_path / "tinypkg" / "__init__.py").write_text("")
    (tmp_path / "tinypkg" / "trainer.py").write_text(PACKAGE_TRAINER)
    (tmp_path / "projects" / "demo").mkdir(parents=True)
    (tmp_path / "projects" / "demo" / "run.py").write_text("import torch\n\nfrom tinypkg.trainer import train\n\n"
                                                           "torch.manual_seed(0)\ntrain()\n")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [".", str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = run_ddpify(["verify", "projects/demo/run.py", "--to", "ddp", "--json"], tmp_path, env, SUBPROCESS_TIMEOUT_S)
    result = json.loads(completed.stdout)
    assert (completed.returncode, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]
