"""DDP024: a multi-GPU script that looks after reproducibility leaves an RNG it draws from unseeded."""

from __future__ import annotations

from ddpify.anatomy import ScriptKind
from ddpify.anatomy.distributed import seeding
from ddpify.lint import Invalid, Rule
from ddpify.rules._seeds import seed_finding


class MissingSeed(Rule, code="DDP024", name="missing-seed", severity="warning"):
    """## What it does
    Flags a multi-GPU script (DDP, FSDP, `mp.spawn` workers, DataParallel) that shows it wants runs
    to repeat (it sets `cudnn.deterministic = True` or `torch.use_deterministic_algorithms(...)`,
    seeds some RNG, or has a seed option such as `--seed` or `args.seed`; an environment's `env.seed(i)`
    is a method, not an option) but leaves an RNG it draws from unseeded:

    - nothing seeds torch: reported where the process group starts (`init_process_group`,
      `mp.spawn`, or the wrap);
    - torch is seeded but numpy or Python's `random` is not, while they drive sampling or
      augmentation (`np.random.beta` for mixup, `random.random()` for a flip): reported at its first draw.

    A seed offset by the rank (`torch.manual_seed(args.seed + rank)`, so that each rank augments
    differently) is a seed: it is reproducible and is not flagged. Scripts that show no such care
    are DDP025's (off by default).

    ## Why is this bad?
    The run is correct (DDP broadcasts rank 0's weights), but no two runs initialise, shuffle,
    drop out or augment alike, so a change can't be told from noise, and a switch such as
    `cudnn.deterministic` buys nothing while an RNG stays unseeded.

    ## Example
    ```python
    torch.backends.cudnn.deterministic = True
    dist.init_process_group("nccl")
    model = DDP(Net().cuda(rank), device_ids=[rank])
    ```

    ## Use instead
    ```python
    torch.backends.cudnn.deterministic = True
    dist.init_process_group("nccl")
    seed_everything(args.seed)  # random, numpy, torch and CUDA
    model = DDP(Net().cuda(rank), device_ids=[rank])
    ```

    ## Fix safety
    Unsafe: where nothing seeds torch, it adds a `seed_everything(seed)` helper after the imports
    (Python's `random`, numpy where the script imports it, torch and every GPU) and calls
    `seed_everything(0)` just before the model is built; runs then repeat, with other numbers than
    before. An unseeded numpy or `random` next to a seeded torch gets no fix: seed it where the
    script seeds torch, with the same seed.
    """

    message = "not reproducible: an RNG the script draws from is never seeded"
    applies_to = frozenset({ScriptKind.DDP, ScriptKind.SPAWN, ScriptKind.DATA_PARALLEL})

    def check(self, a):
        if self.in_scope(a):
            for case in seeding.not_reproducible(a):
                yield seed_finding(a, case)

    def in_scope(self, a) -> bool:
        """Does this rule speak for the script (it looks after reproducibility elsewhere)?"""
        return seeding.looks_after_reproducibility(a)


_HEAD = """import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

"""
_MODEL = "dist.init_process_group('gloo')\nmodel = DDP(nn.Linear(4, 2))\n"
_DETERMINISTIC = "torch.backends.cudnn.deterministic = True\n"
_NUMPY_AUGMENTS = """import numpy as np

def mix(x):
    lam = np.random.beta(1.0, 1.0)
    return lam * x + (1 - lam) * x.flip(0)
"""

MissingSeed.VALID = (
    _HEAD + _DETERMINISTIC + "torch.manual_seed(0)\n" + _MODEL,
    # a seed offset by the rank is a seed (each rank augments its own way)
    _HEAD + "import random\nimport numpy as np\n" + _DETERMINISTIC + _MODEL
    + "seed = 7 + dist.get_rank()\ntorch.manual_seed(seed)\nnp.random.seed(seed)\nrandom.seed(seed)\nx = random.random() + np.random.rand()\n",
    # no sign of caring about reproducibility: DDP025's (off by default)
    _HEAD + _MODEL,
    # torch seeded, and numpy draws nothing
    _HEAD + "import numpy as np\ntorch.manual_seed(0)\n" + _MODEL + "x = np.zeros(3)\n",
    # an environment's own seed (each worker plays its own episodes) is a method called, not a seed option
    _HEAD + "import gym\n" + _MODEL + "env = gym.make('CartPole-v1')\nenv.seed(dist.get_rank())\n",
)
MissingSeed.INVALID = (
    Invalid(_HEAD + _DETERMINISTIC + _MODEL, line=7, fixed=(
        _HEAD.replace("as DDP\n", "as DDP\nimport random\n\n\ndef seed_everything(seed):\n"
                                  '    """Seed every random number generator alike on every rank."""\n'
                                  "    random.seed(seed)\n    torch.manual_seed(seed)\n    torch.cuda.manual_seed_all(seed)\n\n")
        + _DETERMINISTIC + _MODEL.replace("model =", "seed_everything(0)\nmodel =")
    )),
    Invalid(_HEAD + "import argparse\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int, default=0)\n" + _MODEL, line=9),
    # torch seeded, numpy drives the mixup unseeded
    Invalid(_HEAD + _NUMPY_AUGMENTS + "torch.manual_seed(0)\n" + _MODEL, line=9),
)
