"""Loaders and models chosen in branches (issue 29 §2), loaders built anew each epoch (issue 23), and
the DDP wrap after a model's later move by a method of its class (issue 29 §3).

A variable bound in every branch of an if/elif/else is one variable: each branch's DataLoader is
sharded, the epoch loop calls set_epoch once (guarded where a branch's loader could not be
sharded), and the model is wrapped once after the branches. A loader rebuilt each epoch gets
set_epoch right after it is built (named first when the loop builds it inline), and none where
its sampler never shuffles. The fixtures fixtures/real/branch_dataset_loaders.py,
rebuilt_shuffled_loader.py and rebuilt_loader_project/ are run by the real corpus (default
flags); here the non-default branches of branch_dataset_loaders run under torchrun too.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import FIXTURES_DIR, failure_report, run_ddpify, run_script  # noqa: E402

HEAD = """\
import argparse
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset


class Stream(IterableDataset):
    def __iter__(self):
        yield from zip(torch.randn(16, 4), torch.randn(16, 1))


def data(n):
    return TensorDataset(torch.randn(n, 4), torch.randn(n, 1))


"""
EPOCHS = """\
    for epoch in range(2):
        for x, y in train_loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


def convert(body: str) -> tuple:
    """(output, change messages, missing messages) of HEAD + a `main()` holding `body`."""
    text = HEAD + "def main(args):\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n\nif __name__ == '__main__':\n    main(None)\n"
    result = convert_source(text, "ddp", path="t.py")
    return result.output, [c.message for c in result.changes], [m.what for m in result.missing]


def main_body(output: str) -> str:
    return output[output.index("def main(args):"):]


LOADERS_IN_BRANCHES = """\
if args.dataset == "a":
    train_loader = DataLoader(data(16), batch_size=4, shuffle=True)
elif args.dataset == "b":
    train_loader = DataLoader(data(32), batch_size=4, shuffle=True)
else:
    train_loader = DataLoader({last}, batch_size=4{shuffle})
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
""" + textwrap.dedent(EPOCHS)


def test_every_branch_loader_is_sharded_and_set_epoch_is_called_once():
    output, changes, missing = convert(LOADERS_IN_BRANCHES.format(last="data(8)", shuffle=", shuffle=True"))
    assert not missing
    assert main_body(output).count("sampler=DistributedSampler(") == 3
    assert main_body(output).count("train_loader.sampler.set_epoch(epoch)") == 1
    assert "isinstance(" not in main_body(output)
    assert sum("sharded with DistributedSampler" in c for c in changes) == 3


def test_both_loaders_of_a_conditional_expression_are_sharded_under_one_note():
    output, _, missing = convert("train_loader = DataLoader(data(16), batch_size=4, shuffle=True) if args else DataLoader(data(8), batch_size=4, shuffle=True)\n"
                                 "model = nn.Linear(4, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n" + textwrap.dedent(EPOCHS))
    assert not missing, missing
    body = main_body(output)
    assert (body.count("sampler=DistributedSampler("), body.count("# ddpify: batch_size per process"), body.count(".set_epoch(epoch)")) == (2, 1, 1)


def test_a_branch_that_cannot_be_sharded_is_incomplete_and_its_set_epoch_guarded():
    output, _, missing = convert(LOADERS_IN_BRANCHES.format(last="Stream()", shuffle=""))
    assert any("IterableDataset" in m for m in missing), missing
    assert main_body(output).count("sampler=DistributedSampler(") == 2
    assert "        if isinstance(train_loader.sampler, DistributedSampler):" in output
    assert "            train_loader.sampler.set_epoch(epoch)" in output


def test_branch_loaders_with_their_own_sampler_are_incomplete_and_guarded():
    output, _, missing = convert(LOADERS_IN_BRANCHES.format(
        last="data(8)", shuffle=", sampler=torch.utils.data.RandomSampler(range(8))"))
    assert any("has its own sampler" in m for m in missing), missing
    assert "if isinstance(train_loader.sampler, DistributedSampler):" in output


@pytest.mark.parametrize("arms", [
    'if args.arch == "linear":\n    model = nn.Linear(4, 1)\nelse:\n    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))\n',
    'if args.arch in MODELS:\n    model = MODELS[args.arch]()\nelif args.arch == "linear":\n    model = nn.Linear(4, 1)\nelse:\n'
    '    raise SystemExit("unknown")\n',
    'try:\n    model = MODELS[args.arch]()\nexcept KeyError:\n    model = nn.Linear(4, 1)\n',
], ids=["if-else", "registry-elif-raise", "try-except"])
def test_a_model_chosen_in_branches_is_wrapped_once_after_them(arms):
    body = "train_loader = DataLoader(data(16), batch_size=4, shuffle=True)\n" + arms + "model.to('cpu')\n" \
           "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n" + textwrap.dedent(EPOCHS)
    text = HEAD.replace("def data(n):", "MODELS = {'lin': nn.Linear}\n\n\ndef data(n):")
    result = convert_source(text + "def main(args):\n" + textwrap.indent(body, "    ") + "\n\nif __name__ == '__main__':\n    main(None)\n",
                            "ddp", path="t.py")
    assert not result.missing, result.missing
    assert wrap_and_what_follows(result.output, "model") == ("FunctionDef", "model.to('cpu')", "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)")


def wrap_and_what_follows(output: str, target: str) -> tuple:
    """(the node whose body holds the one `target = DDP(...)`, the statement before it, that
    after it), reading past the SyncBatchNorm conversion that may precede the wrap."""
    tree = ast.parse(output)
    blocks = [(node, node.body) for node in ast.walk(tree) if isinstance(getattr(node, "body", None), list)]
    found = [(node, body, i) for node, body in blocks for i, stmt in enumerate(body)
             if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == target
             and isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func) == "DDP"]
    assert len(found) == 1, output
    node, body, i = found[0]
    before = body[i - 2] if isinstance(body[i - 1], ast.If) and "SyncBatchNorm" in ast.unparse(body[i - 1]) else body[i - 1]
    return type(node).__name__, ast.unparse(before), ast.unparse(body[i + 1]) if i + 1 < len(body) else None


def test_a_model_attribute_chosen_in_branches_of_init_is_wrapped_after_them():
    body = """\
    class Trainer:
        def __init__(self, arch):
            if arch == "linear":
                self.model = nn.Linear(4, 1)
            else:
                self.model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.loader = DataLoader(data(16), batch_size=4, shuffle=True)

        def fit(self):
            for epoch in range(2):
                for x, y in self.loader:
                    loss = nn.functional.mse_loss(self.model(x), y)
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()


    if __name__ == "__main__":
        Trainer("linear").fit()
    """
    result = convert_source(HEAD + textwrap.dedent(body), "ddp", path="t.py")
    assert not result.missing, result.missing
    holder, before, after = wrap_and_what_follows(result.output, "self.model")
    assert (holder, before.split(":")[0], after) == ("FunctionDef", "if arch == 'linear'", "self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)")


RUNNER = """\
class Runner:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = DataLoader(data(16), batch_size=4, shuffle=True)

    def to_device(self, device):
        self.device = device
        self.model.to(device)

    def fit(self):
        for epoch in range(2):
            {MOVE}for x, y in self.loader:
                loss = nn.functional.mse_loss(self.model(x), y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()


if __name__ == "__main__":
    runner = Runner(nn.Linear(4, 1))
    runner.to_device("cpu")
    runner.fit()
"""


def test_a_model_moved_later_by_a_method_of_its_class_is_wrapped_after_that_move():
    result = convert_source(HEAD + RUNNER.replace("{MOVE}", ""), "ddp", path="t.py")
    assert not result.missing, result.missing
    assert wrap_and_what_follows(result.output, "self.model") == ("FunctionDef", "self.model.to(device)", None)
    assert not [a.message for a in result.advice if "never moved" in a.message]


def test_a_move_in_a_method_called_every_epoch_gets_no_wrap_of_its_own():
    moved_each_epoch = RUNNER.replace("{MOVE}", "self.to_device('cpu')\n            ")
    result = convert_source(HEAD + moved_each_epoch, "ddp", path="t.py")
    tree = ast.parse(result.output)
    to_device = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "to_device")
    assert "DDP(" not in ast.unparse(to_device), "a wrap there would wrap the wrapper every epoch"


REBUILT_INLINE = """\
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in get_loader(train=True):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def rebuilt(body: str, shuffle: str) -> tuple:
    getter = f"def get_loader(train):\n    return DataLoader(data(16), batch_size=4, shuffle={shuffle})\n\n\n"
    text = HEAD + getter + "def main(args):\n" + textwrap.indent(body, "    ") + "\n\nif __name__ == '__main__':\n    main(None)\n"
    result = convert_source(text, "ddp", path="t.py")
    return result.output, [m.what for m in result.missing]


def test_an_unshuffled_loader_rebuilt_each_epoch_needs_no_set_epoch():
    output, missing = rebuilt(REBUILT_INLINE, "False")
    assert not missing, missing
    assert "set_epoch" not in output and "sampler=DistributedSampler(" in output


def test_a_shuffled_loader_rebuilt_inline_each_epoch_is_named_and_told_the_epoch():
    output, missing = rebuilt(REBUILT_INLINE, "True")
    assert not missing, missing
    assert ("        train_loader = get_loader(train=True)\n"
            "        train_loader.sampler.set_epoch(epoch)\n"
            "        for x, y in train_loader:\n") in output


PER_EPOCH_FUNCTION = """\
def one_epoch({params}):
    loader = get_loader(train=True)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    one_epoch({args})
"""


def test_a_loader_built_in_the_per_epoch_function_is_told_the_epoch_it_is_given():
    output, missing = rebuilt(PER_EPOCH_FUNCTION.format(params="model, optimizer, ep", args="model, optimizer, epoch"), "True")
    assert not missing, missing
    assert "        loader = get_loader(train=True)\n        loader.sampler.set_epoch(ep)\n" in output


def test_a_loader_built_in_a_per_epoch_function_not_given_the_epoch_is_incomplete():
    _, missing = rebuilt(PER_EPOCH_FUNCTION.format(params="model, optimizer", args="model, optimizer"), "True")
    assert any("never told the epoch" in m for m in missing), missing


@pytest.mark.parametrize("shuffle", ["False", "True"])
def test_a_loader_another_module_builds_anew_each_epoch(shuffle, tmp_path):
    """rebuilt_loader_project: data.py's get_loader() is called in the epoch loop (bound, then inline as
    the engine's argument); with shuffle=False nothing needs the epoch, with shuffle=True each new loader gets it."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURES_DIR / "real" / "rebuilt_loader_project", project, ignore=shutil.ignore_patterns("__pycache__"))
    data = project / "data.py"
    data.write_text(data.read_text().replace("shuffle=False", f"shuffle={shuffle}"))
    with contextlib.chdir(project):
        result = CliRunner().invoke(cli, ["convert", "train.py", "--to", "ddp", "--in-place"])
    assert result.exit_code == 0, result.output
    train = (project / "train.py").read_text()
    if shuffle == "False":
        assert "set_epoch" not in train
    else:
        assert ("        loader = get_loader(train=True)\n        loader.sampler.set_epoch(epoch)\n" in train
                and "        train_loader = get_loader(train=True, batch_size=12)\n        train_loader.sampler.set_epoch(epoch)\n"
                    "        train_one_epoch(model, train_loader, optimizer, device, epoch)\n" in train), train


def test_a_loader_rebuilt_each_epoch_in_another_module_verifies(tmp_path):
    """verify's reference takes a loader built again at a site whose first loader trained as training
    (it judged the later ones evaluation loaders and diverged at the second epoch)."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURES_DIR / "real" / "rebuilt_loader_project", project, ignore=shutil.ignore_patterns("__pycache__"))
    proc = run_ddpify(["verify", "train.py", "--to", "ddp", "--steps", "12", "--json", "--timeout", "200"], project, timeout=300)
    assert json.loads(proc.stdout)["verdict"] == "equivalent", failure_report(proc)


STEP = re.compile(r"^epoch (\d+) step (\d+) ")


@pytest.mark.parametrize("flags", [["--dataset", "tiny", "--arch", "narrow"], ["--dataset", "noisy", "--arch", "linear"]],
                         ids=["tiny-narrow", "noisy-linear"])
def test_the_other_branches_of_the_converted_fixture_run_on_two_ranks(flags, tmp_path):
    script = FIXTURES_DIR / "real" / "branch_dataset_loaders.py"
    result = convert_source(script.read_text(), "ddp", path=script.name)
    assert not result.missing
    converted = tmp_path / "branch_dataset_loaders_ddp.py"
    converted.write_text(result.output)
    original = run_script([sys.executable, str(script), *flags], cwd=tmp_path, timeout=120)
    assert original.returncode == 0, failure_report(original)
    run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(converted), *flags],
                     cwd=tmp_path, timeout=120)
    assert run.returncode == 0, failure_report(run)
    steps = [STEP.match(line).groups() for line in run.stdout.splitlines() if STEP.match(line)]
    assert steps and len(steps) == len(set(steps)), "every step is logged once (rank 0 only)"
    assert f"trained {flags[3]} on {flags[1]}" in run.stdout
