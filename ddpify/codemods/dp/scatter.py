"""Transform 6 (reports only): arguments DataParallel must not scatter, outputs it cannot gather.

DataParallel splits every tensor argument of the call along dim 0 and concatenates the replicas'
outputs along dim 0. A recurrent layer's hidden state is `(layers, batch, hidden)` and a
sequence-first input `(seq, batch, ...)`: split along dim 0, each GPU gets some layers or time
steps of the whole batch, not its part of the batch. `pad_packed_sequence` pads each replica's
output to the longest sequence of its own part, so the outputs differ in length and cannot be
joined. Neither has a rewrite that is right in general: the conversion is incomplete, with the
line and what to change by hand. A state that only ever comes out of a wrapped model's earlier call
(`out, hidden = decoder(x, hidden)`) is left alone (ddpify.anatomy.scatter_gather.scatter_misuses).
"""

from __future__ import annotations

import ast

from ddpify.anatomy import ROLE_MODEL, Anatomy, Ref
from ddpify.anatomy.forward_losses import model_calls
from ddpify.anatomy.scatter_gather import ScatterMisuse, misuse_text, scatter_misuses
from ddpify.codemods.base import Transform

SCATTER_TODO = ("let forward take it batch-first and transpose it itself (`{0}.transpose(0, 1)`; a hidden state "
                "returned for the next call transposed back), or create it inside forward")
GATHER_TODO = "pass total_length= (the padded input's length) to pad_packed_sequence, so every replica pads alike"


class ScatterGather(Transform):
    """Refuse model calls whose arguments DataParallel would split across the wrong dimension, or
    whose outputs it cannot gather."""

    NAME = "scatter"
    SEES_EDITS_OF = ()  # reports only, on the user's model calls

    def plan(self) -> None:
        trained = {model.target for model in self.anatomy.trained_models}

        def wraps(call: ast.Call) -> bool:
            return _calls_one_of(self.anatomy, call, trained)

        for call, classes in model_calls(self.anatomy):
            for misuse in scatter_misuses(self.anatomy, call, classes, wraps) if wraps(call) else ():
                self.missing(call.lineno, misuse_text(call, misuse), _todo(misuse))


def _todo(misuse: ScatterMisuse) -> str:
    return GATHER_TODO if misuse.given is None else SCATTER_TODO.format(misuse.hazard.parameter)


def _calls_one_of(anatomy: Anatomy, call: ast.Call, models: set[Ref]) -> bool:
    """Is `call` a call of one of these models?"""
    return any(model.target in models for model in anatomy.origins(call.func, ROLE_MODEL))  # type: ignore[attr-defined]
