"""Every conversion ends converted, nothing to do, or incomplete (what is missing, where, what to do);
`ddpify convert` exits 3 for an incomplete one and writes it only with --partial."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.codemods.ddp import WrapModel
from ddpify.codemods.dp import WrapDataParallel
from ddpify.codemods.pipeline import ConversionResult, Status
from ddpify.commands.convert import FAILED, UNCHANGED, Outcome, exit_code, summary_line
from ddpify.convert import convert_source, lint_leftovers
from ddpify.exit_codes import EXIT_ERROR, EXIT_FOUND, EXIT_INCOMPLETE, EXIT_OK
from ddpify.lint.engine import check_text, rule_set
from ddpify.lint.registry import all_rules
from helpers import one_line

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

HEAD = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
"""
LOOP = """\
for epoch in range(2):
    for x, y in loader:
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
COMPLETE = HEAD + "loader = DataLoader(data, batch_size=4, shuffle=True)\nmodel = nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n" + LOOP
# parameters trained by hand: the data can be sharded, but there is no model to wrap
NO_MODEL = HEAD + """\
loader = DataLoader(data, batch_size=4, shuffle=True)
w = torch.zeros(4, 1, requires_grad=True)
for epoch in range(2):
    for x, y in loader:
        loss = (x @ w - y).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            w.copy_(w - 0.1 * w.grad)
            w.grad.zero_()
"""
# the same tensor updated in the form ddpify knows (w -= lr * w.grad): its gradients are averaged by hand
HAND_TRAINED = NO_MODEL.replace("w.copy_(w - 0.1 * w.grad)", "w -= 0.1 * w.grad")
# full-batch training: a model to wrap, but no loader to shard, and a loss that is no mean or sum of rows
NO_LOADER = HEAD + """\
x, y = data.tensors
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = (model(x) - y).abs().max()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
# a GAN whose discriminator is loaded whole and trained through a library's parameter groups: only
# the generator can be found and wrapped
GAN = HEAD + """\
from mylib import param_groups
loader = DataLoader(data, batch_size=4, shuffle=True)
netG = nn.Linear(4, 4)
netD = torch.load("netD.pt", weights_only=False)
optG = torch.optim.Adam(netG.parameters())
optD = torch.optim.Adam(param_groups(netD))
for epoch in range(2):
    for x, _ in loader:
        lossD = netD(netG(torch.randn(4, 4)).detach()).mean() - netD(x).mean()
        optD.zero_grad()
        lossD.backward()
        optD.step()
        lossG = -netD(netG(torch.randn(4, 4))).mean()
        optG.zero_grad()
        lossG.backward()
        optG.step()
"""
NO_TRAINING = HEAD + "model = nn.Linear(4, 1)\nprint(model(data.tensors[0]).shape)\n"


def line_of(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


# ===== classification ==========================================================================
def test_a_complete_conversion_is_converted():
    for target in ("ddp", "dp"):
        result = convert_source(COMPLETE, target)
        assert result.status is Status.CONVERTED and not result.missing, target


def test_a_script_that_trains_nothing_has_nothing_to_do():
    for target in ("ddp", "dp"):
        result = convert_source(NO_TRAINING, target)
        assert result.status is Status.NOTHING_TO_DO and result.output == NO_TRAINING
        assert "no training found" in result.reason


def test_already_distributed_and_not_torch_have_nothing_to_do():
    assert convert_source("x = 1\n", "ddp").status is Status.NOTHING_TO_DO
    converted = convert_source(COMPLETE, "ddp").output
    again = convert_source(converted, "ddp")
    assert again.status is Status.NOTHING_TO_DO and "already distributed" in again.reason


@pytest.mark.parametrize("target, duty", [("ddp", WrapModel.DUTY), ("dp", WrapDataParallel.DUTY)])
def test_no_model_is_incomplete_even_when_the_data_is_sharded(target, duty):
    result = convert_source(NO_MODEL, target)
    assert result.status is Status.INCOMPLETE
    assert [(m.line, m.what) for m in result.missing] == [(line_of(NO_MODEL, "loss.backward()"), duty.what)]
    if target == "ddp":  # sharding the data without a wrapped model is never silent
        assert "DistributedSampler(" in result.output


def test_tensors_trained_by_hand_start_alike_and_average_their_gradients():
    result = convert_source(HAND_TRAINED, "ddp")
    assert result.status is Status.CONVERTED and not result.missing
    lines = [line.strip() for line in result.output.splitlines()]
    assert lines.index("broadcast_tensors(w)") == lines.index("w = torch.zeros(4, 1, requires_grad=True)") + 1
    assert lines.index("average_tensor_gradients(w)") == lines.index("loss.backward()") + 1
    assert "DistributedSampler(" in result.output


def test_a_model_without_a_loader_is_incomplete_under_ddp_only():
    ddp = convert_source(NO_LOADER, "ddp")
    assert ddp.status is Status.INCOMPLETE and "DDP(\n" in ddp.output and "    model,\n" in ddp.output
    # no DataLoader: the rows of its loss would be shared by rank, but this loss is written by hand
    [missing] = ddp.missing
    assert missing.line == line_of(NO_LOADER, "loss.backward()")
    assert missing.what.startswith("the training data is not sharded") and "written by hand" in missing.what
    assert convert_source(NO_LOADER, "dp").status is Status.CONVERTED  # DataParallel splits each batch itself


def test_a_gan_with_one_model_left_unwrapped_is_incomplete():
    result = convert_source(GAN, "ddp")
    assert "netG = DDP(\n" in result.output and "netD = DDP(" not in result.output
    assert result.status is Status.INCOMPLETE
    ((missing,),) = [result.missing]
    assert missing.line == line_of(GAN, "optD = ") and "not wrapped in DistributedDataParallel" in missing.what
    assert result.reason == f"{missing.what} (line {missing.line})"


@pytest.mark.parametrize("built", ['models.__dict__["resnet18"](num_classes=4)', 'getattr(models, arch)()', 'build_model(cfg)',
                                   'torch.hub.load("pytorch/vision", "resnet18")', 'torch.load("net.pt", weights_only=False)',
                                   'REGISTRY[arch]()'])
def test_a_model_of_unknown_class_that_an_optimizer_trains_is_wrapped(built):
    """No constructor says it is a model, but the optimizer is built on its parameters: it is one."""
    head = HEAD + "import torchvision.models as models\nfrom mylib import build_model, cfg, arch, REGISTRY\n"
    code = COMPLETE.replace(HEAD, head).replace("model = nn.Linear(4, 1)", f"model = {built}")
    for target, wrapped in (("ddp", "model = DDP(model, "), ("dp", "model = nn.DataParallel(model)")):
        result = convert_source(code, target)
        assert result.status is Status.CONVERTED and wrapped in one_line(result.output), (target, result.missing)


def test_zipped_loaders_are_each_sharded_and_told_the_epoch():
    code = COMPLETE.replace("loader = DataLoader(data, batch_size=4, shuffle=True)\n",
                            "loader = DataLoader(data, batch_size=4, shuffle=True)\nother = DataLoader(data, batch_size=4, shuffle=True)\n")
    code = code.replace("    for x, y in loader:\n", "    for (x, y), (x2, y2) in zip(loader, other):\n")
    result = convert_source(code, "ddp")
    output = one_line(result.output)
    assert result.status is Status.CONVERTED and output.count("sampler=DistributedSampler(") == 2
    assert "loader.sampler.set_epoch(epoch)" in output and "other.sampler.set_epoch(epoch)" in output


def test_models_bound_by_unpacking_are_wrapped_each():
    for bound in ("enc, dec = nn.Linear(4, 4), nn.Linear(4, 1)", "from mylib import make_pair\nenc, dec = make_pair()"):
        code = COMPLETE.replace("model = nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)",
                                f"{bound}\nopt = torch.optim.SGD([*enc.parameters(), *dec.parameters()], lr=0.1)")
        code = code.replace("model(x)", "dec(enc(x))")
        result = convert_source(code, "ddp")
        output = one_line(result.output)
        assert result.status is Status.CONVERTED and "enc = DDP(enc, " in output and "dec = DDP(dec, " in output, bound


def test_a_model_container_without_forward_is_not_wrapped_but_missing():
    """`heads["a"](x)` calls a module of the ModuleDict past any wrapper: DDP would sync nothing."""
    code = COMPLETE.replace("model = nn.Linear(4, 1)", "heads = nn.ModuleDict({'a': nn.Linear(4, 1)})")
    code = code.replace("model.parameters()", "heads.parameters()").replace("model(x)", "heads['a'](x)")
    result = convert_source(code, "ddp")
    assert result.status is Status.INCOMPLETE and "DDP(heads" not in one_line(result.output)
    ((missing,),) = [result.missing]
    assert "heads is an nn.ModuleDict: it has no forward" in missing.what and missing.line == line_of(code, "heads = ")


def test_a_training_loader_that_cannot_be_sharded_is_incomplete():
    code = COMPLETE.replace("shuffle=True", "sampler=torch.utils.data.RandomSampler(data)")
    result = convert_source(code, "ddp")
    assert result.status is Status.INCOMPLETE
    assert [m.line for m in result.missing] == [line_of(code, "DataLoader(data")] and "own sampler" in result.missing[0].what


def test_what_ddpify_lint_still_finds_in_the_output_is_missing_at_its_original_line():
    source = "import torch\nstate = torch.load('ckpt.pt')\n"
    output = "import torch\nimport torch.distributed as dist\ndist.init_process_group('gloo')\nstate = torch.load('ckpt.pt')\n"
    result = ConversionResult(source=source, output=output, origins=[1, 1, 1, 2])
    ((missing,),) = [lint_leftovers(result, ast.parse(output), "t.py")]
    assert missing.line == 2 and missing.what.startswith("ddpify lint still finds DDP001 (torch-load-without-map-location)")
    assert "ddpify rule DDP001" in missing.todo


def test_every_lint_finding_in_an_output_is_named_as_missing():
    code = COMPLETE + "print(model(torch.ones(1, 4)))\n"  # rank-0 output that calls the DDP wrapper
    result = convert_source(code, "ddp")
    findings, _ = check_text(result.output, "t.py", rule_set(frozenset(r.code for r in all_rules() if r.default_enabled)))
    assert {result.original_line(f.pos.line) for f in findings} <= {m.line for m in result.missing}
    assert (result.status is Status.CONVERTED) == (not findings)


# ===== exit codes and the summary line =========================================================
def test_exit_code_precedence():
    converted, incomplete = Outcome(Status.CONVERTED, True), Outcome(Status.INCOMPLETE, True)
    assert exit_code([UNCHANGED, converted], check=False) == EXIT_OK
    assert exit_code([UNCHANGED, converted], check=True) == EXIT_FOUND
    assert exit_code([converted, incomplete], check=True) == EXIT_INCOMPLETE
    assert exit_code([incomplete, FAILED], check=True) == EXIT_ERROR
    assert summary_line([converted, incomplete, UNCHANGED, UNCHANGED]) == "1 converted, 1 incomplete, 2 unchanged, 0 failed"


# ===== the command =============================================================================
def invoke(*args):
    return CliRunner().invoke(cli, ["convert", *map(str, args)], catch_exceptions=False)


def script(tmp_path: Path, code: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(code)
    return path


def test_incomplete_writes_nothing_and_exits_3(tmp_path):
    path = script(tmp_path, NO_MODEL)
    result = invoke(path, "--to", "ddp")
    assert result.exit_code == EXIT_INCOMPLETE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
    line = line_of(NO_MODEL, "loss.backward()")
    assert f"{path}:{line}: missing: {WrapModel.DUTY.what}; {WrapModel.DUTY.todo}" in result.output.splitlines()
    assert result.output.splitlines()[-1] == (
        f"{path}: incomplete: {WrapModel.DUTY.what} (line {line}); nothing written (use --partial to write it anyway)"
    )


def test_incomplete_to_stdout_prints_no_code_without_partial(tmp_path):
    result = CliRunner().invoke(cli, ["convert", str(script(tmp_path, NO_MODEL)), "--to", "ddp", "-o", "-"])
    assert result.exit_code == EXIT_INCOMPLETE and result.stdout == "" and "nothing written" in result.stderr


def test_partial_writes_it_and_still_exits_3(tmp_path):
    path = script(tmp_path, NO_MODEL)
    result = invoke(path, "--to", "ddp", "--partial")
    assert result.exit_code == EXIT_INCOMPLETE
    written = tmp_path / "train_ddp.py"
    assert written.read_text() == convert_source(NO_MODEL, "ddp", path=str(path)).output
    assert f"wrote {written}" in result.output
    assert result.output.splitlines()[-1].endswith("; written anyway (--partial): finish it by hand")


@pytest.mark.parametrize("mode", ["--check", "--diff"])
def test_check_and_diff_of_an_incomplete_conversion_exit_3(tmp_path, mode):
    path = script(tmp_path, NO_MODEL)
    result = CliRunner().invoke(cli, ["convert", str(path), "--to", "ddp", mode])
    assert result.exit_code == EXIT_INCOMPLETE
    assert f"{path}: incomplete: " in result.stderr
    assert ("+++ b/" in result.stdout) if mode == "--diff" else ("would convert" in result.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_run_over_several_files_ends_with_one_summary_line(tmp_path):
    script(tmp_path, COMPLETE, "a.py")
    script(tmp_path, NO_MODEL, "b.py")
    script(tmp_path, NO_TRAINING, "c.py")
    script(tmp_path, "import torch\ndef broken(:\n", "d.py")
    result = invoke(tmp_path, "--to", "ddp")
    assert result.exit_code == EXIT_ERROR  # bad input comes first
    # c.py trains nothing and has no __main__ block: a walk converts entry points only (ddpify.project_conversion)
    assert result.output.splitlines()[-1] == "1 converted, 1 incomplete, 0 unchanged, 1 failed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py", "a_ddp.py", "b.py", "c.py", "d.py"]


def test_to_dp_never_exits_0_without_writing_or_saying_why(tmp_path):
    silent = script(tmp_path, NO_TRAINING, "infer.py")
    result = invoke(silent, "--to", "dp")
    assert result.exit_code == EXIT_OK and f"{silent}: no training found" in result.output
    unwrapped = script(tmp_path, NO_MODEL)
    result = invoke(unwrapped, "--to", "dp")
    assert result.exit_code == EXIT_INCOMPLETE and f"{unwrapped}: incomplete: {WrapDataParallel.DUTY.what}" in result.output
    fixture = tmp_path / "basic_main.py"
    shutil.copy(FIXTURES / "basic_main.py", fixture)
    result = invoke(fixture, "--to", "dp")
    assert result.exit_code == EXIT_OK and (tmp_path / "basic_main_dp.py").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basic_main.py", "basic_main_dp.py", "infer.py", "train.py"]


def test_help_documents_the_exit_codes():
    lines = [line.strip() for line in CliRunner().invoke(cli, ["convert", "--help"]).output.splitlines()]
    exit_codes = lines[lines.index("Exit codes (the first that applies):") + 1:][:4]
    assert [line.split()[0] for line in exit_codes] == ["2", "3", "1", "0"]
    assert exit_codes[1] == "3  a conversion is incomplete (also with --partial, --diff or --check)"
    assert any(line.startswith("--partial") for line in lines)
