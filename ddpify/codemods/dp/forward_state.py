"""Transform 5 (reports only): state that `forward` keeps on the module is lost under DataParallel.

Each call copies the model onto every GPU and runs `forward` on the copies; `self.calls += 1` or
`self.cache = out` happen on copies that are thrown away afterwards, and in-place changes to a
shared list race between the replicas' threads. The code stays as it is and the conversion is
incomplete: the user moves that state out of the model.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.forward import replica_forward_methods, state_mutations
from ddpify.codemods.base import Transform

_LIMIT = 60


class ForwardState(Transform):
    """Warn about module state changed inside forward(): replicas are discarded after each call."""

    NAME = "forward-state"
    SEES_EDITS_OF = ()  # reports only, on the user's forward()s

    def plan(self) -> None:
        for forward in replica_forward_methods(self.anatomy, self.anatomy.trained_models):
            for mutation in state_mutations(self.anatomy, forward):
                self.missing(mutation.lineno, _what(mutation), "keep this state outside the model")


def _what(mutation: ast.AST) -> str:
    code = ast.unparse(mutation)
    code = code if len(code) <= _LIMIT else code[: _LIMIT - 3] + "..."
    return (
        f"`{code}` changes the model inside forward(); under DataParallel it runs on per-GPU copies "
        "that are discarded after each call, so the change is lost (on GPUs)"
    )
