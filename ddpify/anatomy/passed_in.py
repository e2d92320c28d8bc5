"""Which parameters a value arrives through: `self.model` in `Trainer.run` holds what callers pass to
`Trainer.__init__`'s `model` (`self.model = model`), so the class of what they pass is its class."""

from __future__ import annotations

import ast
from typing import Iterator

from ddpify.anatomy.distributed.reaching import reaching_values
from ddpify.anatomy.script import Anatomy

MAX_STEPS = 6  # variables followed back from the read


def parameters_reaching(a: Anatomy, expr: ast.AST) -> Iterator[tuple[str, str]]:
    """(function scope, parameter) for each parameter whose argument may reach `expr`, followed back
    through the variables assigned in between (`model, config = self.model, self.config`)."""
    seen: set[ast.AST] = set()
    todo = [(expr, 0)]
    while todo:
        node, steps = todo.pop()
        ref = a.ref(node) if isinstance(node, (ast.Name, ast.Attribute)) and node not in seen else None
        if ref is None or steps > MAX_STEPS:
            continue
        seen.add(node)
        fn = a.functions.get(ref.scope)
        if fn is not None and ref.name in fn.params:
            yield ref.scope, ref.name
        else:
            todo += [(value, steps + 1) for value in reaching_values(a, node)]
