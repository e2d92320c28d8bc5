"""One `Accelerator`, built once after the imports: it joins the process group torchrun (or
`accelerate launch`) describes, picks this process's device, and takes the script's AMP.
Without a GPU it is told to run on the CPU (cpu=True), where it joins torchrun's processes over
gloo; left to itself, each process would train alone on all of the data.

Mixed precision follows the script's own: a GradScaler or an fp16 autocast gives "fp16", a bf16
autocast "bf16", only where CUDA is available (as the scripts' AMP is; Accelerate's fp16 needs a
GPU). A model whose backward may leave parameters without a gradient gets the DDP wrap's
find_unused_parameters=True through DistributedDataParallelKwargs. A shuffled training loader is
shuffled by use_seedable_sampler's generator (torch's initial seed plus the epoch, the same on
every process and in every run, so verify can mirror it), and `--batch-size global` splits each
batch over the processes (split_batches=True).
"""

from __future__ import annotations

from ddpify.anatomy import Anatomy
from ddpify.anatomy.syntax import keyword
from ddpify.anatomy.unused_parameters import may_leave_parameters_unused
from ddpify.anatomy.vocabulary import ACCELERATOR as ACCELERATOR_CLASS, AUTOCAST, BFLOAT16, DDP_KWARGS, GRAD_SCALER, HALF_DTYPES, LOADER_CONFIG
from ddpify.codemods.accelerate.prepare import returned_training_loaders
from ddpify.codemods.accelerate.runtime import ACCELERATOR, MIXED_PRECISION, ON_CPU
from ddpify.codemods.base import Transform
from ddpify.edits.positions import last_leading_import


class AcceleratorSetup(Transform):
    """Build `accelerator = Accelerator(...)` once, after the script's imports."""

    NAME = "accelerator"
    SEES_EDITS_OF = ()

    def plan(self) -> None:
        anchor = last_leading_import(self.anatomy.tree)
        if anchor is None:
            self.missing(1, "no Accelerator is built (no top-level `import torch` to put it after)",
                         "add `accelerator = Accelerator()` after the imports by hand")
            return
        module, name = ACCELERATOR_CLASS.rsplit(".", 1)
        self.add_import("torch")
        self.add_import(module, name)
        options = [ON_CPU, *self._mixed_precision(), *self._loader_options(), *self._ddp_options()]
        self.insert_after(anchor, f"\n{ACCELERATOR} = {name}({', '.join(options)})\n")
        self.leave_room_for_helpers_after(anchor)  # the helpers the DDP target's transforms add (rows.py)
        self.changed(anchor.lineno, f"{ACCELERATOR} = {name}({', '.join(options)}): the process group, this process's "
                                    "device and mixed precision, set up once")

    def _mixed_precision(self) -> list[str]:
        dtype = amp_dtype(self.anatomy)
        return [f"mixed_precision={MIXED_PRECISION.format(dtype=dtype)}"] if dtype else []

    def _loader_options(self) -> list[str]:
        """Prepared loaders shuffle by a seeded generator, and split the global batch with --batch-size global."""
        prepared = [*self.anatomy.train_loaders, *returned_training_loaders(self.anatomy)]
        options = ["use_seedable_sampler=True"] if any(self.anatomy.loader_shuffles(ld) for ld in prepared) else []
        options += ["split_batches=True"] if self.options.batch_size == "global" else []
        if not options:
            return []
        module, name = LOADER_CONFIG.rsplit(".", 1)
        self.add_import(module, name)
        return [f"dataloader_config={name}({', '.join(options)})"]

    def _ddp_options(self) -> list[str]:
        """find_unused_parameters=True where a backward may leave a model's parameters without a gradient."""
        if not any(may_leave_parameters_unused(self.anatomy, model) for model in self.anatomy.trained_models):
            return []
        module, name = DDP_KWARGS.rsplit(".", 1)
        self.add_import(module, name)
        return [f"kwargs_handlers=[{name}(find_unused_parameters=True)]"]


def amp_dtype(anatomy: Anatomy) -> str | None:
    """"fp16" where the script scales its loss or autocasts to fp16, "bf16" where it autocasts to bf16, else None."""
    if anatomy.calls_to(GRAD_SCALER):
        return "fp16"
    dtypes = set()
    for autocast in anatomy.calls_to(AUTOCAST):
        given = keyword(autocast.node, "dtype")  # type: ignore[arg-type]
        dtypes.add(anatomy.qualname(given.value) if given is not None else None)
    if dtypes & HALF_DTYPES:
        return "fp16"
    if BFLOAT16 in dtypes:
        return "bf16"
    return "fp16" if dtypes else None  # autocast's default on CUDA is fp16
