"""The DataParallel codemod: the transforms that turn a single-GPU script into an nn.DataParallel one, in order."""

from ddpify.codemods.dp.batch_size import BatchSizeAdvice
from ddpify.codemods.dp.devices import ForwardDevices
from ddpify.codemods.dp.forward_state import ForwardState
from ddpify.codemods.dp.loss import MeanLoss
from ddpify.codemods.dp.module_access import DPModuleAccess
from ddpify.codemods.dp.scatter import ScatterGather
from ddpify.codemods.dp.wrap import WrapDataParallel
from ddpify.codemods.seeds import SeedWhereAskedFor

DP_TRANSFORMS = (SeedWhereAskedFor, ForwardDevices, WrapDataParallel, MeanLoss, DPModuleAccess, ForwardState, ScatterGather, BatchSizeAdvice)
