"""One vocabulary: each PyTorch name set has one home, and the analysis, convert and lint read it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.distributed.reaching import assignments
from ddpify.anatomy.distributed.wrappers import is_wrapper
from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.sites import MODULE_SCOPE, Ref
from ddpify.anatomy.vocabulary import DP_WRAPPER
from ddpify.convert import convert_source
from ddpify.lint.engine import RuleSet, check_text
from ddpify.lint.registry import all_rules

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "ddpify" / "anatomy" / "vocabulary.py"
# One member of each set: its spelling as a string literal may stand in vocabulary.py only.
MEMBERS = [
    '"tqdm.std.tqdm"', '"tqdm.auto.tqdm"', '"tensorboardX.SummaryWriter"', '"wandb.init"', '"torch.optim."',
    '"bfloat16"', '"requires_grad_"', '"named_parameters"', '"src_device_obj"', '"will_sync_module_buffers"',
    '"io.open"', '"numpy.savez"', '"torch.nn.ModuleList"', '"torchvision.models."', '"exception"',
    '"torch.save"', '"torch.load"', '"builtins.print"', '"tqdm.write"', '"Histogram"', '"wandb."',
]
# The names that decide what is rank-0 output: read by the judgement (ddpify.anatomy.output) alone,
# so the rank-0 transform, the lint rules, FSDP and explain cannot decide it each their own way.
RANK_ZERO_POLICY = ["INFO_LOG_METHODS", "WANDB_MEDIA", "TQDM_WRITE", "FILE_WRITE_METHODS", "FILE_REMOVE_METHODS"]


def _python_files():
    return [p for d in ("ddpify", "rules") for p in (ROOT / d).rglob("*.py")]


@pytest.mark.parametrize("member", MEMBERS)
def test_each_vocabulary_has_one_home(member):
    homes = sorted(str(p.relative_to(ROOT)) for p in _python_files() if member in p.read_text())
    assert homes == [str(HOME.relative_to(ROOT))]


@pytest.mark.parametrize("name", RANK_ZERO_POLICY)
def test_one_module_judges_rank_zero_output(name):
    readers = sorted(str(p.relative_to(ROOT)) for p in _python_files() if re.search(rf"\b{name}\b", p.read_text()))
    assert set(readers) <= {"ddpify/anatomy/vocabulary.py", "ddpify/anatomy/output.py"}, readers


def test_no_module_keeps_its_own_cache_on_the_anatomy():
    pokes = [p.name for p in _python_files() if re.search(r"\b(a|anatomy)\.__dict__", p.read_text())]
    assert pokes == ["cache.py"]


def test_a_loop_over_tqdm_std_iterates_the_loader():
    """The analysis's copy of the tqdm set lacked tqdm.std.tqdm: this loader was not found as trained."""
    a = analyze(
        "import torch\nfrom tqdm.std import tqdm\n\nmodel = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)\n"
        "for batch in tqdm(loader):\n    opt.zero_grad()\n    model(batch).sum().backward()\n    opt.step()\n"
    )
    assert [ld.line for ld in a.train_loaders] == [6]


def test_bindings_give_each_layer_what_it_reads():
    a = analyze("a, b = 1, 2\nc = d = 3\nc += 1\nfor e in range(3):\n    pass\nf, g = pair()\n")
    found = bindings(a)

    def values(name):
        return [(b.value.value if b.value is not None else None, b.whole) for b in found[Ref(MODULE_SCOPE, name)]]

    assert values("a") == [(1, False)] and values("b") == [(2, False)]
    assert values("c") == [(3, True), (None, False)] and values("d") == [(3, True)]
    assert values("e") == [(None, False)] and values("f") == [(None, False)]
    assert [v.value for _, v in assignments(a)[Ref(MODULE_SCOPE, "c")]] == [3]


DP_HEAD = "import torch\nfrom torch import nn\n\nnet = nn.Linear(4, 2)\n"


@pytest.mark.parametrize("expr", ["nn.DataParallel(net)", "nn.DataParallel(net).to('cpu')",
                                  "nn.DataParallel(net) if torch.cuda.is_available() else net"])
def test_one_is_wrapper_for_ddp_and_dataparallel(expr):
    a = analyze(DP_HEAD + f"model = {expr}\nmodel.train()\n")
    read = a.tree.body[-1].value.func.value  # `model` in model.train()
    assert is_wrapper(a, read, DP_WRAPPER)
    assert not is_wrapper(a, read)  # not a DDP wrapper


RANK_ZERO_PRINT = '''import os

import torch


def is_main_process():
    return int(os.environ.get("RANK", 0)) == 0


def main():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)
    for epoch in range(2):
        for x in loader:
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
        if is_main_process():
            print(epoch, loss.item())
        print("done", epoch)


if __name__ == "__main__":
    main()
'''


def test_convert_leaves_a_print_that_lint_judges_rank_zero_only():
    output = convert_source(RANK_ZERO_PRINT, "ddp", path="train.py").output
    assert "if is_main_process():\n            print(epoch, loss.item())" in output
    assert "if RANK == 0:\n            print(\"done\", epoch)" in output
    diagnostics, errors = check_text(output, "train.py", RuleSet(all_rules()))
    assert not errors and not [d for d in diagnostics if d.code == "DDP007"]
