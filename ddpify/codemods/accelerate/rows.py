"""Each process's share of the rows of every loss, where no DataLoader feeds training: the DDP
target's RowsOfEachRank (ddpify.codemods.ddp.rows) with its helper spelled with the Accelerator.

Whole tensors, a graph's nodes picked by a mask, batches cut by hand: there is no loader for
`accelerator.prepare` to shard. Each loss call becomes `loss_of_rank_rows(criterion, output, target)`,
every `num_processes`-th row of the batch on this process, weighted so that the prepared model's
gradient average is exactly the single-process gradient, and valued as the whole batch's loss.
"""

from ddpify.codemods.accelerate.runtime import accelerator_spelling, ddp_names_left
from ddpify.codemods.ddp.rows import RowsOfEachRank


class AcceleratorRows(RowsOfEachRank):
    """Each process's share of the rows of every loss, where training reads no DataLoader."""

    def add_helper(self, name: str, code: str) -> None:
        """The DDP helper, with the Accelerator's process index, process count and reduce."""
        spelled = accelerator_spelling(code)
        left = ddp_names_left(spelled)
        if left:
            self.missing(1, f"the rows of each loss are not shared: ddpify has no Accelerate spelling of {', '.join(left)} (in {name})",
                         "share them by hand (accelerator.process_index, accelerator.num_processes, accelerator.reduce)")
            return
        super().add_helper(name, spelled)
