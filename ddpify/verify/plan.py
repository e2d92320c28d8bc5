"""The verify plan: what to run, how, and where each process leaves its files.

Written as JSON by the command, read by the launcher and every harness process.
Imports only the standard library.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # the folder holding ddpify
REFERENCE = "reference"
CANDIDATE = "candidate"

EXACT_TOLERANCE = 1e-5
# Parameter error relative to how far training has moved them (L2 norms). Adaptive optimizers
# (Adam & co.) turn float noise in near-zero gradients into whole-sized updates of a few elements:
# the max relative difference sees those, this norm does not; a real bug moves the whole update.
UPDATE_TOLERANCE = 1e-2
STATISTICAL_LOSS_TOLERANCE = 5e-2
# The records' flag that a forward ran through a multi-GPU wrapper (detail: its class); a candidate
# without it trains as the single process does, whatever its steps show: it is not converted.
WRAPPER_FLAG = "wrapper_forward"
# The records' flag that a product paired the training batch's rows with each other (`x @ x.T` of a pull-away
# term, a contrastive loss): each rank pairs its own rows only, so no DDP port that keeps it per rank matches exactly.
PAIRS_FLAG = "batch_pairs"

_EXTENSIONS = {"record": ".json", "error": ".txt", "stack": ".txt", "log": ".txt"}


@dataclass(frozen=True)
class Run:
    """One script to execute: the reference (1 process) or the candidate (`ranks` processes)."""

    script: str
    import_dir: str
    workdir: str
    ranks: int
    argv0: str = ""  # sys.argv[0] as the user would type it (default: the script's path)
    root: str = ""  # this side's mirror of the plan's `home` folder


@dataclass(frozen=True)
class ScriptBatch:
    """Where the script sets its training batch, as verify can set it for the reference: a module-level
    constant (`batch_size = 100`: its literal's line and columns) or an argparse option (`--batch_size`).
    A script that writes its batch into a shape (`x.reshape(batch_size, -1)`) takes no re-cut batch of
    N ranks x batch; written in where the script sets it, the global batch reaches the shape too."""

    where: str  # how the report names it: `batch_size = 100` at main.py:17, `--batch_size` (train.py:30)
    value: int  # the script's batch
    line: int = 0  # the constant's line and its literal's columns (0: an option)
    col: int = 0
    end_col: int = 0
    option: str = ""  # the option's string, where it is an option

    def source(self, text: str, world: int) -> str:
        """The script's source with the constant's literal made `world` times larger."""
        if not self.line:
            return text
        lines = text.splitlines(keepends=True)
        code = lines[self.line - 1].encode()
        lines[self.line - 1] = (code[:self.col] + str(self.value * world).encode() + code[self.end_col:]).decode()
        return "".join(lines)

    def argv(self, args: tuple[str, ...], world: int) -> tuple[str, ...]:
        """The script's arguments with the option set to `world` times the batch (added where absent)."""
        if not self.option:
            return args
        wider = str(self.value * world)
        for i, arg in enumerate(args):
            if arg == self.option and i + 1 < len(args):
                return (*args[:i + 1], wider, *args[i + 2:])
            if arg.startswith(self.option + "="):
                return (*args[:i], f"{self.option}={wider}", *args[i + 1:])
        return (*args, self.option, wider)


@dataclass(frozen=True)
class Plan:
    """Everything the launcher and the harness need to know about one verify pair."""

    target: str
    steps: int
    device: str
    batch_mode: str
    timeout: float
    launcher: str
    outdir: str
    script_args: tuple[str, ...]
    reference: Run
    candidate: Run
    reference_training_lines: tuple[int, ...] = ()  # DataLoader calls static analysis saw train
    dp_replicas: int = 0  # GPUs that DataParallel splits each batch over (0 unless target is dp)
    dp_simulated: bool = False  # fewer than 2 GPUs: the replicas are simulated (see dataparallel.py)
    # (DataLoader line, epoch loop's first line, its last line, the epoch its first iteration sets)
    reference_epoch_loops: tuple[tuple[int, int, int, int], ...] = ()
    # The converter's changes by the candidate's lines: (file, line, "line N of <original>: [transform] message")
    changes: tuple[tuple[str, int, str], ...] = ()
    # The converter gave each rank its rows of every loss (codemods/ddp/rows.py): each rank's loss is
    # valued as the whole batch's, so equal losses on every rank do not mean the ranks share their data.
    loss_rows_shared: bool = False
    # The converter gave each rank an environment of its own (codemods/ddp/environments.py): the ranks
    # play other episodes than the reference, so no step's loss compares with the reference's.
    plays_own_episodes: bool = False
    # The converter averaged the gradients of an optimizer a model owns, or of tensors trained by hand, by
    # hand (codemods/ddp/owned_optimizers.py, hand_gradients.py): no forward runs through a wrapper, yet the
    # ranks' gradients are averaged.
    averages_by_hand: bool = False
    # The user's folder that each side mirrors (the working directory or the project root above it):
    # absolute PYTHONPATH entries inside it are followed into the side's mirror.
    home: str = ""
    # Where the reference can be given the global batch, should it fail on the re-cut one (see ScriptBatch),
    # and whether this run of the reference is the one that does so.
    script_batch: ScriptBatch | None = None
    global_batch: bool = False

    def change_at(self, file: str, line: int) -> str | None:
        """The converter's change that wrote `line` of the candidate's `file`, when its report names one."""
        file = os.path.realpath(file)
        return next((change for path, at, change in self.changes if at == line and os.path.realpath(path) == file), None)

    @property
    def nproc(self) -> int:
        return self.candidate.ranks

    def run(self, role: str) -> Run:
        return self.reference if role == REFERENCE else self.candidate

    def aligns_reference(self) -> bool:
        """A DDP candidate draws its batches from DistributedSampler, so the reference's are re-cut to match;
        not where the ranks share the rows of each loss instead (every rank reads the reference's batches)."""
        return self.distributed and not self.loss_rows_shared

    @property
    def distributed(self) -> bool:
        """One process per rank under torchrun (DDP, FSDP), as opposed to DataParallel's one process."""
        return self.target in ("ddp", "fsdp", "accelerate")

    def splits_batches(self) -> bool:
        """Each batch split over several ranks or replicas: where plain BatchNorm and reduced precision stop matching."""
        return self.averages_across_ranks() or (self.target == "dp" and self.dp_replicas > 1)

    def ranks_normalize_apart(self) -> bool:
        """Does the candidate's plain BatchNorm normalize each rank's (or replica's) part of a split batch alone,
        so that the reference must too? Always on CPU, where SyncBatchNorm cannot run, and under DataParallel,
        which SyncBatchNorm does not support; on GPUs a DDP port may use SyncBatchNorm (converted scripts do),
        which normalizes the whole batch as the reference does."""
        return self.splits_batches() and (self.device == "cpu" or self.target == "dp")

    @property
    def batch_parts(self) -> int:
        """Into how many parts each batch is split: ranks, or DataParallel's replicas."""
        return self.nproc if self.distributed else self.dp_replicas

    def averages_across_ranks(self) -> bool:
        """Gradients averaged over several ranks: where sum losses stop matching."""
        return self.distributed and self.nproc > 1

    def file(self, kind: str, role: str, rank: int) -> str:
        """Path of one process's `record`, `error`, `stack` or `log` file."""
        return os.path.join(self.outdir, f"{kind}-{role}-{rank}{_EXTENSIONS[kind]}")

    @property
    def result_path(self) -> str:
        return os.path.join(self.outdir, "result.json")

    @property
    def path(self) -> str:
        return os.path.join(self.outdir, "plan.json")

    def save(self) -> str:
        with open(self.path, "w") as f:
            json.dump(asdict(self), f, indent=1)
        return self.path

    @classmethod
    def load(cls, path: str) -> Plan:
        with open(path) as f:
            data = json.load(f)
        data["script_args"] = tuple(data["script_args"])
        data["reference_training_lines"] = tuple(data["reference_training_lines"])
        data["reference_epoch_loops"] = tuple(tuple(loop) for loop in data["reference_epoch_loops"])
        data["changes"] = tuple(tuple(change) for change in data["changes"])
        data["reference"] = Run(**data["reference"])
        data["candidate"] = Run(**data["candidate"])
        data["script_batch"] = ScriptBatch(**data["script_batch"]) if data.get("script_batch") else None
        return cls(**data)
