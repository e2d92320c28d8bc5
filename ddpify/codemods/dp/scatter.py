"""Transform 6 (reports only): arguments DataParallel must not scatter, outputs it cannot gather.

DataParallel splits every tensor argument of the call along dim 0 and concatenates the replicas'
outputs along dim 0. A recurrent layer's hidden state is `(layers, batch, hidden)` and a
sequence-first input `(seq, batch, ...)`: split along dim 0, each GPU gets some layers or time
steps of the whole batch, not its part of the batch. `pad_packed_sequence` pads each replica's
output to the longest sequence of its own part, so the outputs differ in length and cannot be
joined. Neither has a rewrite that is right in general: the conversion is incomplete, with the
line and what to change by hand. A state that only ever comes out of a wrapped model's earlier call
(`out, hidden = decoder(x, hidden)`) is left alone: gathered along dim 0, it splits back into the
parts each replica returned.
"""

from __future__ import annotations

import ast

from ddpify.anatomy import ROLE_MODEL, Anatomy, Ref
from ddpify.anatomy.bindings import bindings
from ddpify.anatomy.facts import ReplicaFacts, ScatterHazard
from ddpify.anatomy.forward import model_calls, model_replica_facts
from ddpify.codemods.base import Transform

_SCATTER_TODO = ("let forward take it batch-first and transpose it itself (`{0}.transpose(0, 1)`; a hidden state "
                 "returned for the next call transposed back), or create it inside forward")
_GATHER_TODO = "pass total_length= (the padded input's length) to pad_packed_sequence, so every replica pads alike"


class ScatterGather(Transform):
    """Refuse model calls whose arguments DataParallel would split across the wrong dimension, or
    whose outputs it cannot gather."""

    NAME = "scatter"
    SEES_EDITS_OF = ()  # reports only, on the user's model calls

    def plan(self) -> None:
        self.trained = {model.target for model in self.anatomy.trained_models}
        for call, classes in model_calls(self.anatomy):
            if not _calls_one_of(self.anatomy, call, self.trained):
                continue
            for facts in filter(None, (model_replica_facts(self.anatomy, cls) for cls in classes)):
                for hazard in facts.hazards:
                    self._refuse(call, hazard, facts)

    def _refuse(self, call: ast.Call, hazard: ScatterHazard, facts: ReplicaFacts) -> None:
        where = f"{facts.path}:{hazard.line}"
        if hazard.parameter is None:
            self.missing(call.lineno, f"DataParallel cannot gather what `{ast.unparse(call.func)}(...)` returns: {hazard.why} ({where})", _GATHER_TODO)
            return
        given = call.args[hazard.index] if hazard.index < len(call.args) else next((kw.value for kw in call.keywords if kw.arg == hazard.parameter), None)
        if given is not None and not self._round_trips(given):
            self.missing(call.lineno, f"DataParallel would split `{ast.unparse(given)}` along dim 0, not along its batch: {hazard.why} ({where})",
                         _SCATTER_TODO.format(hazard.parameter))

    def _round_trips(self, given: ast.expr) -> bool:
        """Does `given` only ever hold None or what a call of a wrapped model returned?"""
        ref = self.anatomy.ref(given) if isinstance(given, ast.Name) else None
        found = bindings(self.anatomy).get(ref, []) if ref is not None else []
        return bool(found) and all(
            isinstance(b.value, ast.Constant) and b.value.value is None
            or isinstance(b.stmt, ast.Assign) and isinstance(b.stmt.value, ast.Call) and _calls_one_of(self.anatomy, b.stmt.value, self.trained)
            for b in found
        )


def _calls_one_of(anatomy: Anatomy, call: ast.Call, models: set[Ref]) -> bool:
    """Is `call` a call of one of these models?"""
    return any(model.target in models for model in anatomy.origins(call.func, ROLE_MODEL))  # type: ignore[attr-defined]
