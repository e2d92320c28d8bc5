"""The Accelerate codemod: a single-GPU script made a Hugging Face Accelerate one, in order.

One Accelerator after the imports (process group, device, the script's mixed precision), the
device it picks, `accelerator.prepare` for the trained models, their optimizers and the training
loaders, `accelerator.backward`, `accelerator.unwrap_model` for a prepared model's own methods and
state, evaluation rows gathered with `gather_for_metrics`, accumulation under `accelerator.accumulate`
where exact, and the DDP target's judgements (rank-0 output, summed losses, the same random_split on
every process, data no loader deals made each process's own, downloads once per disk) written with the
Accelerator's calls.
"""

from ddpify.codemods.accelerate.backward import AcceleratorBackward
from ddpify.codemods.accelerate.devices import AcceleratorDevice
from ddpify.codemods.accelerate.evaluation import AcceleratorEvaluation
from ddpify.codemods.accelerate.gradients import AcceleratorNoSync, AcceleratorSumLoss
from ddpify.codemods.accelerate.library import ModuleWithoutAccelerator
from ddpify.codemods.accelerate.module_access import UnwrapModelAccess
from ddpify.codemods.accelerate.per_node import AcceleratorPerNode
from ddpify.codemods.accelerate.own_data import AcceleratorBatchDraws, AcceleratorEnvironments, AcceleratorOwnedOptimizers
from ddpify.codemods.accelerate.prepare import PrepareForAccelerator
from ddpify.codemods.accelerate.rank_zero import AcceleratorRankZero
from ddpify.codemods.accelerate.rows import AcceleratorRows
from ddpify.codemods.accelerate.setup import AcceleratorSetup
from ddpify.codemods.ddp.random_split import SameSplitOnEveryRank
from ddpify.codemods.ddp.wrap import RemoveDataParallel

ACCELERATE_TRANSFORMS = (
    AcceleratorSetup, AcceleratorDevice, RemoveDataParallel, PrepareForAccelerator, AcceleratorOwnedOptimizers, UnwrapModelAccess, SameSplitOnEveryRank,
    AcceleratorRows, AcceleratorBatchDraws, AcceleratorEnvironments, AcceleratorEvaluation, AcceleratorRankZero, AcceleratorNoSync, AcceleratorSumLoss, AcceleratorBackward,
    AcceleratorPerNode,
)
# A module the entry imports: no Accelerator of its own (ddpify.codemods.accelerate.library).
ACCELERATE_LIBRARY_TRANSFORMS = tuple(t for t in ACCELERATE_TRANSFORMS if t is not AcceleratorSetup) + (ModuleWithoutAccelerator,)
