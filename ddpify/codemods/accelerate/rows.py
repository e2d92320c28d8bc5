"""Each process's share of the rows of every loss, where no DataLoader feeds training: the DDP
target's RowsOfEachRank (ddpify.codemods.ddp.rows) with its helper spelled with the Accelerator.

Whole tensors, a graph's nodes picked by a mask, batches cut by hand: there is no loader for
`accelerator.prepare` to shard. Each loss call becomes `loss_of_rank_rows(criterion, output, target)`,
every `num_processes`-th row of the batch on this process, weighted so that the prepared model's
gradient average is exactly the single-process gradient, and valued as the whole batch's loss.
"""

from ddpify.codemods.accelerate.spelled import SpelledWithTheAccelerator
from ddpify.codemods.ddp.rows import RowsOfEachRank


class AcceleratorRows(SpelledWithTheAccelerator, RowsOfEachRank):
    """Each process's share of the rows of every loss, where training reads no DataLoader."""
