"""Transform 2: wrap each trained model in `nn.DataParallel` once it is on its GPU.

The wrapper goes after the model's last move to a device (`model.to(device)`, `if ...: model.cuda()`),
outside any `if`/`with`/`try` that holds that move, so the script uses the wrapper on every path;
but never past a statement that uses the model: a block that goes on to train it (the
`if __name__ == "__main__":` block that builds the model and runs the loop) keeps the wrap inside.
Without GPUs DataParallel just calls the model, so the script still runs (and trains the same) on CPU.
`device_ids` is left to its default (every visible GPU, the first one primary) unless the script
puts the model on another GPU, which then has to come first. A script that sets
CUDA_VISIBLE_DEVICES itself is told that DataParallel only sees the GPUs listed there.
A model whose forward runs on the whole data and mixes its rows (a graph's nodes: `adj @ h`, trained on the
rows of a mask) is left unwrapped and the conversion unfinished: DataParallel would split every input along
dim 0, handing each GPU rows that need the others (anatomy/full_batch.py, whole_data_forward).
"""

from __future__ import annotations

import ast

from ddpify.anatomy import Anatomy, ModelSite, Ref
from ddpify.anatomy.tree import walk_body
from ddpify.anatomy.distributed.launch import env_writes
from ddpify.anatomy.full_batch import whole_data_forward
from ddpify.anatomy.literals import model_gpu_index, model_moves
from ddpify.codemods.base import Transform
from ddpify.codemods.containers import wrap_each
from ddpify.codemods.duties import wrap_duty

_ENCLOSING_BLOCKS = (ast.If, ast.With, ast.Try)
WHOLE_DATA_TODO = ("convert with --to ddp instead (each rank runs the whole forward and the ranks share the loss's rows), "
                   "or keep training on one GPU")


class WrapDataParallel(Transform):
    """Wrap each trained model in nn.DataParallel once its parameters are on the primary GPU."""

    NAME = "wrap"
    DUTY = wrap_duty("nn.DataParallel", "on cuda:0", "model = nn.DataParallel(model)")

    def plan(self) -> None:
        models = self.models_to_wrap("nn.DataParallel")
        if not models:
            return
        torch_nn = self._torch_nn()
        for model in models:
            if not self._splits_rows_apart(model):
                self._wrap(model, torch_nn)
                self.fulfil()
        for write in env_writes(self.anatomy, "CUDA_VISIBLE_DEVICES"):
            self.advise(write.lineno, "the script sets CUDA_VISIBLE_DEVICES: DataParallel only uses the GPUs it lists; list them all, or remove it")  # type: ignore[attr-defined]

    def _splits_rows_apart(self, model: ModelSite) -> bool:
        """Would DataParallel's split along dim 0 hand each GPU rows whose forward needs the others? Then it is missing."""
        found = whole_data_forward(self.anatomy, model)
        if found is not None:
            call, why = found
            self.missing(call.lineno, f"{model.target.name} is not wrapped in nn.DataParallel: `{ast.unparse(call)}` runs the forward on the "
                                      f"whole data, of which the loss reads some rows only, and the forward may mix rows ({why}): DataParallel "
                                      "would split every input along dim 0 over the GPUs, handing each GPU rows that need the others",
                         WHOLE_DATA_TODO)
        return found is not None

    def _torch_nn(self) -> str:
        """How the script spells `torch.nn`: `nn` after `import torch.nn as nn` / `from torch import nn`."""
        aliases = self.anatomy.names.aliases
        spelled = next((name for name, q in aliases.items() if q == "torch.nn"), None)
        return spelled or f"{self._torch()}.nn"

    def _torch(self) -> str:
        spelled = next((name for name, q in self.anatomy.names.aliases.items() if q == "torch"), None)
        if spelled is None:
            self.add_import("torch")
        return spelled or "torch"

    def _wrap(self, model: ModelSite, torch_nn: str) -> None:
        name = model.target.name
        anchor = _outside_conditionals(self.anatomy, model.placements[-1] if model.placements else model.stmt, model.target)
        if model.container:
            self.insert_after(anchor, wrap_each(name, model.container, lambda net: f"{torch_nn}.DataParallel({net})"))
            self.changed(anchor.lineno, f"wrapped each model in {name} in nn.DataParallel")
            return
        self.insert_after(anchor, f"{name} = {torch_nn}.DataParallel({name}{self._device_ids(model)})\n")
        self.changed(anchor.lineno, f"wrapped {name} in nn.DataParallel (one replica per visible GPU; on CPU it calls the model directly)")
        if not model_moves(model):
            self.advise(model.line, f"{name} is not moved to a GPU here; DataParallel needs its parameters on device_ids[0] (cuda:0)")

    def _device_ids(self, model: ModelSite) -> str:
        """`device_ids` naming the model's GPU first, when the script puts it on one other than cuda:0."""
        index = model_gpu_index(self.anatomy, model)
        if not index:
            return ""
        others = f"[i for i in range({self._torch()}.cuda.device_count()) if i != {index}]"
        self.changed(model.line, f"{model.target.name} lives on cuda:{index}: device_ids starts with {index} (DataParallel's primary GPU)")
        return f", device_ids=[{index}] + {others}"


def _outside_conditionals(anatomy: Anatomy, stmt: ast.stmt, model: Ref) -> ast.stmt:
    """The outermost `if`/`with`/`try` statement that holds `stmt` (within its function) and reads
    `model` nowhere after it, or `stmt`."""
    for holder in anatomy.enclosing(stmt, _ENCLOSING_BLOCKS):
        if _reads_after(anatomy, holder, stmt, model):
            break
        stmt = holder  # type: ignore[assignment]
    return stmt


def _reads_after(anatomy: Anatomy, holder: ast.AST, stmt: ast.stmt, model: Ref) -> bool:
    """Does code inside `holder` read `model` after `stmt` ends?"""
    end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    return any(
        isinstance(node, (ast.Name, ast.Attribute)) and (node.lineno, node.col_offset) > end and anatomy.ref(node) == model
        for node in walk_body([holder])
    )
