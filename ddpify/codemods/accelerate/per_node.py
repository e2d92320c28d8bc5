"""Per-node duties the Accelerate way: a download runs on each machine's local main process first, the
machine's other processes waiting for it (what `accelerator.local_main_process_first()` does), so that
every machine, its disk its own, gets the whole download (ddpify.codemods.ddp.per_node)."""

from __future__ import annotations

from ddpify.anatomy.vocabulary import ACCELERATOR as ACCELERATOR_CLASS
from ddpify.codemods.accelerate.runtime import BARRIER, LOCAL_MAIN_PROCESS
from ddpify.codemods.ddp.per_node import PerNodeDownloads


class AcceleratorPerNode(PerNodeDownloads):
    """Downloads run on each machine's local main process first; its other processes wait for them."""

    SEES_EDITS_OF = ("accelerator", "rank0")  # the Accelerator built before, rank-0 guards around
    WAIT = f"if not {LOCAL_MAIN_PROCESS}:\n    {BARRIER}  # the local main process downloads first, once per machine\n"
    RELEASE = f"if {LOCAL_MAIN_PROCESS}:\n    {BARRIER}  # the machine's other processes now find the files\n"
    JOINS_GROUP = ACCELERATOR_CLASS
