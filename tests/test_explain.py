"""`ddpify explain`: a static report of a script's anatomy and the changes --to ddp would make."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.commands.explain import explain_source, render_text

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _info(name, target="ddp"):
    path = FIXTURES / name
    return explain_source(path.read_text(), str(path), target)


def test_trainer_class():
    info = _info("trainer_class.py")
    assert info["kind"] == "single-gpu"
    assert info["entry"]["main_guard_line"] == 64
    (model,) = info["models"]
    assert model["variable"] == "self.model" and model["class"] == "Regressor" and model["trained"]
    assert info["optimizers"] == [{"class": "torch.optim.Adam", "line": 28}]
    assert info["loaders"] == [{"variable": "loader", "line": 67, "role": "train"}]
    assert [lp["loop_var"] for lp in info["epoch_loops"]] == ["epoch"]
    assert [lp["loop_var"] for lp in info["step_loops"]] == ["step"]
    assert info["backward"] == [38] and info["optimizer_step"] == [39]
    assert info["side_effects"]["print"] == [50, 52, 70]
    transforms = {c["transform"] for c in info["conversion"]["changes"]}
    assert {"setup", "wrap", "sampler", "rank0"} <= transforms


def test_helper_functions_train_and_eval_loaders():
    info = _info("helper_functions.py")
    assert info["entry"]["function"] == "main"
    assert {(ld["variable"], ld["role"]) for ld in info["loaders"]} == {("train_loader", "train"), ("val_loader", "eval")}
    assert info["conversion"]["advice"]


def test_notebook_style_has_no_main_guard():
    info = _info("notebook_style.py")
    assert info["entry"]["main_guard_line"] is None
    assert "top-level module code" in render_text(info)


def test_batchnorm_and_side_effects():
    info = _info("batchnorm_cnn.py")
    assert info["models"][0]["batchnorm"] is True
    assert "has BatchNorm" in render_text(info)
    assert _info("logging_script.py")["side_effects"]["logging"]
    assert _info("tensorboard_logging.py")["side_effects"]["tensorboard"]
    saves = _info("checkpoint_resume.py")["side_effects"]
    assert saves["save"] and saves["load"]


def test_dp_preview_and_already_distributed():
    assert _info("trainer_class.py", "dp")["conversion"]["target"] == "dp"
    info = explain_source("import torch\ntorch.distributed.init_process_group('nccl')\n", "x.py")
    assert info["kind"] == "ddp" and "already distributed" in info["conversion"]["note"]
    assert "do nothing" in render_text(info)


@pytest.mark.parametrize("name", ["trainer_class.py", "helper_functions.py", "notebook_style.py", "two_loaders.py"])
def test_cli_text_and_json(name):
    runner = CliRunner()
    text = runner.invoke(cli, ["explain", str(FIXTURES / name)])
    assert text.exit_code == 0, text.output
    assert "--to ddp would:" in text.output and "loaders:" in text.output
    data = runner.invoke(cli, ["explain", "--json", str(FIXTURES / name)])
    assert data.exit_code == 0
    assert json.loads(data.output)["kind"] == "single-gpu"


def test_cli_never_runs_the_script(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("import torch\nraise SystemExit('executed!')\n")
    result = CliRunner().invoke(cli, ["explain", str(script)])
    assert result.exit_code == 0 and "executed!" not in result.output


def test_cli_bad_input(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    result = CliRunner().invoke(cli, ["explain", str(bad)])
    assert result.exit_code == 2
