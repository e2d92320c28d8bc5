"""Tensors trained by hand, with no module and no optimizer: `w -= learning_rate * w.grad`.

A script that keeps its weights in bare tensors (`torch.randn(..., requires_grad=True)`) and updates
them from their gradients by hand has no model for DDP to wrap. Each rank then averages those
tensors' gradients itself after backward, as DDP would before the update: with the loss's rows
shared by the ranks (full_batch.py), the averaged gradient is the single-process one, exactly.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE
from ddpify.anatomy.trained_models import variable_updated


def hand_trained_tensors(a: Anatomy, scope: str) -> list[str]:
    """The variables of `scope` that a statement there updates from their own gradient (`w -= lr * w.grad`,
    `w.data -= ...`), in source order; none where an optimizer or a model trains the script."""
    if a.optimizers or a.trained_models:
        return []
    updates = (n for n in a.nodes if isinstance(n, ast.AugAssign) and a.scope_of.get(n, MODULE_SCOPE) == scope)
    return list(dict.fromkeys(name for n in updates if (name := _updated_from_its_gradient(n)) is not None))


def _updated_from_its_gradient(update: ast.AugAssign) -> str | None:
    """`w` in `w -= lr * w.grad` (or `w.data -= ...`)."""
    name = variable_updated(update.target)
    reads_gradient = any(isinstance(n, ast.Attribute) and n.attr == "grad" and isinstance(n.value, ast.Name) and n.value.id == name
                         for n in ast.walk(update.value))
    return name if reads_gradient else None
