"""The names an Accelerate conversion writes into a script: one `Accelerator` and what it offers."""

import importlib.util
import re

from ddpify.anatomy.distributed.accelerate import BROADCASTS

ACCELERATOR = "accelerator"
ON_MAIN_PROCESS = f"{ACCELERATOR}.is_main_process"
LOCAL_MAIN_PROCESS = f"{ACCELERATOR}.is_local_main_process"  # one per machine
OFF_MAIN_PROCESS = f"not {LOCAL_MAIN_PROCESS}"  # a progress bar's disable=: one per machine
DEVICE = f"{ACCELERATOR}.device"
WORLD_SIZE = f"{ACCELERATOR}.num_processes"
PROCESS_INDEX = f"{ACCELERATOR}.process_index"
LOCAL_PROCESS_INDEX = f"{ACCELERATOR}.local_process_index"
REDUCE = f"{ACCELERATOR}.reduce"
GATHER = f"{ACCELERATOR}.gather"
GATHER_FOR_METRICS = f"{ACCELERATOR}.gather_for_metrics"
BARRIER = f"{ACCELERATOR}.wait_for_everyone()"
PREPARE = f"{ACCELERATOR}.prepare"
BACKWARD = f"{ACCELERATOR}.backward"
CLIP_GRAD_NORM = f"{ACCELERATOR}.clip_grad_norm_"
UNWRAP_MODEL = f"{ACCELERATOR}.unwrap_model"
PRINT = f"{ACCELERATOR}.print"
SAVE = f"{ACCELERATOR}.save"
NO_SYNC = f"{ACCELERATOR}.no_sync"
ACCUMULATE = f"{ACCELERATOR}.accumulate"
ACCUMULATION_STEPS = f"{ACCELERATOR}.gradient_accumulation_steps"
# An imported module's Accelerator: the entry script's, set there once built (handover.py).
HANDED_OVER = f"# ddpify: the entry script's Accelerator, which it hands over once built (one per process)\n{ACCELERATOR}: {{name}} | None = None"
# Without a GPU, Accelerate joins torchrun's processes (gloo) only when told to run on the CPU;
# otherwise each process would train alone, on all of the data.
ON_CPU = "cpu=not torch.cuda.is_available()"
# The script's AMP (autocast, GradScaler) runs on CUDA; Accelerate's fp16 needs a GPU.
MIXED_PRECISION = '"{dtype}" if torch.cuda.is_available() else "no"'
INSTALL = 'pip install "ddpify[accelerate]"  (or: pip install "accelerate>=1.0")'


def accelerate_installed() -> bool:
    """Can this Python import accelerate? (Found without importing it: that imports torch.)"""
    try:
        return importlib.util.find_spec("accelerate") is not None
    except (ImportError, ValueError):
        return False


def install_note() -> str:
    """What `convert` says after writing an Accelerate script where accelerate is not installed."""
    return "" if accelerate_installed() else f"\nnote: running it needs accelerate, which is not installed here: {INSTALL}"


# What a DDP helper may still name once spelled with the Accelerator: torch.distributed calls and rank constants it has no spelling for.
_DDP_NAMES = re.compile(r"\b(dist\.\w+|RANK_DEVICE|LOCAL_RANK|RANK|WORLD_SIZE|setup_distributed)\b")
# The DDP target's names and calls, each as the Accelerator spells it, in order (RANK_DEVICE before RANK;
# accelerate.utils' broadcasts, imported where the code uses them: BROADCASTS).
_SPELLINGS = (
    (r"^[ \t]*setup_distributed\(\).*\n", ""),  # the Accelerator joined the group when it was built
    (r"^(\s*)dist\.all_reduce\(([\w.]+)\)$", rf'\1\2 = {REDUCE}(\2, "sum")'),
    (r"^(\s*)dist\.all_reduce\(([\w.]+), op=dist\.ReduceOp\.MIN\)$", rf"\1\2 = {GATHER}(\2).min()"),
    (r"\bdist\.(broadcast|broadcast_object_list)\((.*), src=(\w+)\)", r"\1(\2, from_process=\3)"),
    (r"\bRANK == 0\b", ON_MAIN_PROCESS), (r"\bRANK_DEVICE\b", DEVICE), (r"\bLOCAL_RANK\b", LOCAL_PROCESS_INDEX), (r"\bRANK\b", PROCESS_INDEX), (r"\bWORLD_SIZE\b", WORLD_SIZE),
)


def ddp_names_left(code: str) -> list[str]:
    """The names of the DDP target's runtime that `code` still uses (none once accelerator_spelling could spell them all)."""
    return sorted(set(_DDP_NAMES.findall(code)))


def accelerator_spelling(code: str) -> str:
    """Code of the DDP target (a helper of ddpify.codemods.ddp.runtime, a rank added to a seed) spelled with
    the Accelerator: this process's index, device and the number of processes for RANK, RANK_DEVICE and
    WORLD_SIZE, `t = accelerator.reduce(t, "sum")` for `dist.all_reduce(t)` (which is `t` itself on one
    process, where no process group exists), the gathered minimum for a MIN all_reduce, and
    accelerate.utils' broadcasts for torch.distributed's."""
    for pattern, spelled in _SPELLINGS:
        code = re.sub(pattern, spelled, code, flags=re.M)
    return code


def broadcasts_used(code: str) -> list[str]:
    """The broadcasts of accelerate.utils that spelled code calls (each to import)."""
    return [name for name in BROADCASTS if re.search(rf"(?<![\w.]){name}\(", code)]
