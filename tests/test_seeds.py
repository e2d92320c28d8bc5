"""Missing seeds (issue 25): DDP023's wrong results, DDP024/DDP025's reproducibility, and the seed
helper `convert --to fsdp` adds where the script seeds nothing."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from ddpify.convert import convert_source
from ddpify.lint.config import Config
from ddpify.lint.engine import Options, RuleSet, check_text, fix_text
from ddpify.lint.registry import all_rules

sys.path.insert(0, str(Path(__file__).resolve().parent))
import helpers  # noqa: E402

SINGLE = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
"""
GROUP = "import torch\nimport torch.distributed as dist\nfrom torch import nn\n\ndist.init_process_group('gloo')\n"
FSDP2 = GROUP + "from torch.distributed.fsdp import fully_shard\n{seed}model = nn.Linear(4, 2)\nfully_shard(model)\n"
DDP = GROUP + "from torch.nn.parallel import DistributedDataParallel as DDP\n{seed}model = DDP(nn.Linear(4, 2))\n"
EVERY_SEED = "import random\nimport numpy as np\nrandom.seed(0)\nnp.random.seed(0)\ntorch.manual_seed(0)\n"


def findings(code: str, select: tuple[str, ...] | None = None) -> list[tuple[str, str, int]]:
    codes = Config(select=select).enabled(all_rules(), "train.py")
    found, errors = check_text(code, "train.py", RuleSet(r for r in all_rules() if r.code in codes))
    assert not errors
    return [(d.code, d.severity, d.pos.line) for d in found if d.code in ("DDP023", "DDP024", "DDP025")]


def test_fsdp2_without_a_seed_is_an_error_where_the_model_is_built():
    assert findings(FSDP2.format(seed="")) == [("DDP023", "error", 7)]


def test_plain_ddp_without_a_seed_is_not_reproducible_only():
    code = DDP.format(seed="")
    assert findings(code) == []  # no sign of caring: DDP025 is off by default
    assert findings(code, select=("ALL",)) == [("DDP025", "warning", 5)]
    caring = code.replace("dist.init", "torch.backends.cudnn.deterministic = True\ndist.init")
    assert findings(caring) == [("DDP024", "warning", 6)]


@pytest.mark.parametrize("template", [FSDP2, DDP])
def test_a_script_that_seeds_everything_gets_nothing(template):
    assert findings(template.format(seed=EVERY_SEED), select=("ALL",)) == []


def test_a_seed_offset_by_the_rank_is_reproducible_but_not_for_a_sharded_model():
    per_rank = "torch.manual_seed(dist.get_rank())\n"
    assert findings(DDP.format(seed=per_rank), select=("ALL",)) == []
    assert findings(FSDP2.format(seed=per_rank)) == [("DDP023", "error", 8)]


def test_convert_to_fsdp_seeds_every_rng_once_before_the_model_and_lints_clean():
    code = textwrap.dedent(SINGLE).replace("import torch\n", "import numpy as np\nimport torch\n", 1)
    result = convert_source(code, "fsdp", path="train.py")
    out = result.output
    assert out.count("def seed_everything(seed):") == 1 and "np.random.seed(seed)" in out and "import random\n" in out
    lines = out.splitlines()
    assert lines.index("    seed_everything(0)") + 1 == lines.index("    model = nn.Linear(4, 1)")
    assert findings(out, select=("ALL",)) == []
    assert convert_source(out, "fsdp").output == out


def test_convert_to_fsdp_keeps_a_script_that_seeds_torch_as_it_is():
    seeded = textwrap.dedent(SINGLE).replace("    model = nn", "    torch.manual_seed(1)\n    model = nn")
    assert "seed_everything" not in convert_source(seeded, "fsdp", path="train.py").output
    drawn_alike = textwrap.dedent(SINGLE).replace("torch.randn(16, 4), torch.randn(16, 1)", "torch.ones(16, 4), torch.ones(16, 1)")
    assert "seed_everything" not in convert_source(drawn_alike, "ddp", path="train.py").output  # DDP broadcasts the weights


SHARDED = """import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = nn.Linear(8, 8)
built = model.weight.detach().clone()
fully_shard(model)
alike = torch.tensor([float(torch.equal(model.weight.full_tensor(), built))])
dist.all_reduce(alike, op=dist.ReduceOp.MIN)
if dist.get_rank() == 0:
    print("the sharded model is", "every rank's own" if alike.item() else "a mix of the ranks' initialisations")
dist.barrier()
sys.stdout.flush()
os._exit(0)  # no teardown: gloo's can abort a rank at exit under load ('terminate called without an active exception')
"""


def _sharded_on_two_ranks(code: str, tmp_path) -> str:
    script = tmp_path / "sharded.py"
    script.write_text(code)
    run = helpers.run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                     tmp_path, {"OMP_NUM_THREADS": "1"}, 180)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_an_unseeded_fully_shard_mixes_initialisations_and_the_fix_makes_them_one(tmp_path):
    """Proof by execution of DDP023's claim and of its fix, on two gloo ranks (forked ones seed their
    generators from the OS, as torchrun's fresh interpreters do: tests/forkserver.py)."""
    assert "a mix of the ranks' initialisations" in _sharded_on_two_ranks(SHARDED, tmp_path)
    fixed, applied, left, errors = fix_text(SHARDED, "sharded.py", RuleSet(all_rules()), Options(fix=True, unsafe_fixes=True))
    assert applied and not errors and "DDP023" not in {d.code for d in left}
    assert "every rank's own" in _sharded_on_two_ranks(fixed, tmp_path)
