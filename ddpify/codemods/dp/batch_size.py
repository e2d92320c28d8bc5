"""Transform 7 (advice only): DataParallel needs at least one sample per GPU in every batch.

The training loader's batch is split across the GPUs; with fewer samples than GPUs some GPUs get
nothing to do (and BatchNorm fails on a single sample). The advice points at the line where the
batch size is written (`batch_size=4`, `BATCH_SIZE = 4`, or a DataLoader without batch_size: 1).
"""

from __future__ import annotations

from ddpify.anatomy import LoaderSite
from ddpify.anatomy.literals import literal
from ddpify.codemods.base import Transform

FEW_SAMPLES = 8  # GPUs in a typical multi-GPU machine
_WHY = (
    "DataParallel splits every batch across the GPUs, so a batch needs at least one sample per GPU "
    "(two with BatchNorm) and GPUs beyond the batch size sit idle; use a batch size of at least the number of GPUs"
)


class BatchSizeAdvice(Transform):
    """Warn when the training batch is smaller than the number of GPUs DataParallel splits it over."""

    NAME = "batch-size"
    SEES_EDITS_OF = ()  # advice only, on the user's loaders

    def plan(self) -> None:
        for loader in self.anatomy.train_loaders:
            self._check(loader)

    def _check(self, loader: LoaderSite) -> None:
        call = loader.call
        given = next((kw.value for kw in call.keywords if kw.arg in ("batch_size", "batch_sampler")), None)
        if given is None and len(call.args) > 1:
            given = call.args[1]
        if given is None:
            self.advise(loader.line, f"DataLoader without batch_size loads one sample per batch; {_WHY}")
            return
        written = literal(self.anatomy, given)
        size = written.value if written is not None else None
        if isinstance(size, int) and not isinstance(size, bool) and size < FEW_SAMPLES:
            self.advise(written.lineno, f"batch size {size} is small for DataParallel: {_WHY}")  # type: ignore[union-attr]
