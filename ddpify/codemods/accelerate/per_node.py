"""Per-node duties the Accelerate way: a download runs on the main process first, then on each other
machine's local main process, then on the rest, each waiting for the one before (`main_process_first()`,
then `local_main_process_first()`): a machine whose disk is its own gets the whole download, and machines
sharing a filesystem download once (ddpify.codemods.ddp.per_node)."""

from __future__ import annotations

from ddpify.anatomy.vocabulary import ACCELERATOR as ACCELERATOR_CLASS
from ddpify.codemods.accelerate.runtime import BARRIER, LOCAL_MAIN_PROCESS, ON_MAIN_PROCESS
from ddpify.codemods.ddp.per_node import PerNodeDownloads


class AcceleratorPerNode(PerNodeDownloads):
    """Downloads run on the main process first, then on the other machines' local main process, then on the rest."""

    SEES_EDITS_OF = ("accelerator", "rank0")  # the Accelerator built before, rank-0 guards around
    WAIT = (f"if not {ON_MAIN_PROCESS}:\n    {BARRIER}  # the main process downloads first\n"
            f"if not {LOCAL_MAIN_PROCESS}:\n    {BARRIER}  # then each machine's local main process\n")
    RELEASE = (f"if {ON_MAIN_PROCESS}:\n    {BARRIER}  # other machines find the files on a shared disk\n"
               f"if {LOCAL_MAIN_PROCESS}:\n    {BARRIER}  # the machine's other processes now find the files\n")
    JOINS_GROUP = ACCELERATOR_CLASS
