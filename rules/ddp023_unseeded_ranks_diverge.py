"""DDP023: an unseeded RNG makes the ranks draw different numbers where they must agree."""

from __future__ import annotations

from ddpify.anatomy.distributed import seeding
from ddpify.lint import Invalid, Rule
from ddpify.rules._seeds import seed_finding


class UnseededRanksDiverge(Rule, code="DDP023", name="unseeded-ranks-diverge", severity="error"):
    """## What it does
    Flags a process-per-GPU script whose ranks draw different random numbers where training needs
    them alike, because the RNG they draw from is not seeded (or is seeded with the rank) before:

    - a model sharded with FSDP2's `fully_shard` (or legacy FSDP without `sync_module_states=True`),
      unless it loads pretrained weights;
    - gradients averaged by hand (`dist.all_reduce(p.grad)`) with no DDP wrap and no broadcast of
      the parameters;
    - weights initialised after the DDP wrap (`nn.init.*`, `reset_parameters()`, `.normal_()` on the
      wrapped model);
    - a train/validation split drawn on every rank: `train_test_split` without `random_state`, or an
      index list shuffled and then cut (`random_split` is DDP011's);
    - data a `DistributedSampler` shards that is drawn from a global RNG (`np.random.normal(...)`,
      `torch.randn(...)`) not seeded alike before the draw.

    It reports where the model is built (the first random draw the ranks must share), or at the
    initialisation, the split or the data's first draw itself.

    ## Why is this bad?
    DDP broadcasts rank 0's weights when it wraps the model, so an unseeded DDP model is fine. These
    cases have no such broadcast: `fully_shard` keeps each rank's own initialisation of its shard,
    so the model is a mix of WORLD_SIZE initialisations; hand-averaged gradients update WORLD_SIZE
    different models; weights drawn after the wrap differ on every rank for good; and a split
    drawn on each rank puts one rank's validation samples into another rank's training set, so
    the validation score is optimistic. Data drawn on each rank is a different data set on each,
    so the sampler's shards partition none of them.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = Transformer(args)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    seed_everything(0)  # random, numpy, torch and CUDA alike on every rank
    model = Transformer(args)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    ```

    ## Fix safety
    Unsafe: where the model is built, it adds a `seed_everything(seed)` helper after the imports
    (Python's `random`, numpy where the script imports it, torch and every GPU) and calls
    `seed_everything(0)` just before the model; the run then draws other numbers than before, and
    a seed the script sets later (per rank, for augmentation) still applies after it. Splits and
    initialisations after the wrap, and data drawn before a sampler, get no fix: seed them where the
    script's own seed belongs.
    """

    message = "wrong results: the ranks draw different random numbers where they must agree"

    def check(self, a):
        for case in seeding.wrong_results(a):
            yield seed_finding(a, case)


_HEAD = """import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
"""
_SHARDED = "model = nn.Linear(4, 2)\nfully_shard(model)\n"
_SEEDED = """import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
import random


def seed_everything(seed):
    \"\"\"Seed every random number generator alike on every rank.\"\"\"
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


dist.init_process_group("gloo")
seed_everything(0)
"""
_HAND_AVERAGED = """import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
model = nn.Linear(4, 2)
def train():
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
"""
_DDP_HEAD = """import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
"""

_SHARDED_DATA = """from torch.utils.data import DistributedSampler, TensorDataset
x = torch.linspace(-1, 1, 64)
y = x ** 2 + 0.1 * torch.randn(64)
sampler = DistributedSampler(TensorDataset(x, y))
"""

UnseededRanksDiverge.VALID = (
    _HEAD.replace('"gloo")\n', '"gloo")\ntorch.manual_seed(0)\n') + _SHARDED,
    # an imported helper named after seeding seeds what it reaches
    _HEAD + "from utils import fix_random_seeds\nfix_random_seeds(0)\n" + _SHARDED,
    # legacy FSDP broadcasting rank 0's weights
    _HEAD + "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
            "model = FSDP(nn.Linear(4, 2), sync_module_states=True)\n",
    # pretrained weights are alike on every rank
    _HEAD + "import transformers\nmodel = transformers.AutoModel.from_pretrained('gpt2')\nfully_shard(model)\n",
    # DDP broadcasts rank 0's weights: an unseeded DDP model is right (DDP024 says it is not reproducible)
    _DDP_HEAD + "model = DDP(nn.Linear(4, 2))\n",
    # hand-averaged gradients of a model whose parameters rank 0 broadcasts
    _HAND_AVERAGED.replace("    opt = ", "    for p in model.parameters():\n        dist.broadcast(p.data, 0)\n    opt = "),
    # a split seeded like the rest of the script, and one with its own random_state
    _DDP_HEAD + "import numpy as np\nnp.random.seed(0)\nidx = np.random.permutation(100)\ntrain, val = idx[:90], idx[90:]\n",
    _DDP_HEAD + "from sklearn.model_selection import train_test_split\ntrain, val = train_test_split(list(range(10)), random_state=0)\n",
    # an initialisation before the wrap is broadcast by it
    _DDP_HEAD + "net = nn.Linear(4, 2)\nnn.init.zeros_(net.bias)\nnet.reset_parameters()\nmodel = DDP(net)\n",
    # data drawn after a seed alike on every rank, and noise drawn per sample in a transform
    _DDP_HEAD + _SHARDED_DATA.replace("x = ", "torch.manual_seed(0)\nx = "),
    _DDP_HEAD + "from torch.utils.data import DistributedSampler\nimport torchvision\n"
                "data = torchvision.datasets.MNIST('.', transform=lambda x: x + torch.randn(1))\nsampler = DistributedSampler(data)\n",
)
UnseededRanksDiverge.INVALID = (
    Invalid(_HEAD + _SHARDED, line=7, fixed=_SEEDED + _SHARDED),
    # seeded, but with the rank: each rank still initialises its shard differently
    Invalid(_HEAD + "torch.manual_seed(dist.get_rank())\n" + _SHARDED, line=8),
    Invalid(_HEAD + "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nmodel = FSDP(nn.Linear(4, 2))\n", line=8),
    Invalid(_HAND_AVERAGED, line=6),
    Invalid(_DDP_HEAD + "model = DDP(nn.Linear(4, 2))\nnn.init.normal_(model.module.weight)\n", line=8),
    Invalid(_DDP_HEAD + "from sklearn.model_selection import train_test_split\ntrain, val = train_test_split(list(range(10)))\n", line=8),
    Invalid(_DDP_HEAD + "import random\nidx = list(range(100))\nrandom.shuffle(idx)\ntrain, val = idx[:90], idx[90:]\n", line=9),
    Invalid(_DDP_HEAD + _SHARDED_DATA, line=9),
)
