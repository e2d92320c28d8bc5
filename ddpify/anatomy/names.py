"""Resolve local names to qualified names through the file's own imports.

`import torch.nn as nn`, `from torch import nn` and `from torch.utils.data import DataLoader as DL`
all make `nn.Linear` / `DL` resolve to `torch.nn.Linear` / `torch.utils.data.DataLoader`.
This is a flat, file-wide alias table rather than LibCST's scope-aware QualifiedNameProvider:
shadowing an import name is rare in training scripts, and the table costs one pass over the
import statements instead of a full scope analysis (which dominates lint time).
"""

from __future__ import annotations

import ast
from typing import Iterable

# Public torch paths that re-export a deeper definition: map the deep path to the public one.
_CANONICAL_PREFIXES = {
    "torch.nn.modules.batchnorm.": "torch.nn.",
    "torch.nn.parallel.distributed.": "torch.nn.parallel.",
    "torch.nn.parallel.data_parallel.": "torch.nn.parallel.",
    "torch.utils.data.dataloader.": "torch.utils.data.",
    "torch.utils.data.distributed.": "torch.utils.data.",
    "torch.cuda.amp.grad_scaler.": "torch.cuda.amp.",
}

# Names that are the same object under two public paths.
_SYNONYMS = {
    "torch.nn.DataParallel": "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "torch.cuda.amp.GradScaler": "torch.amp.GradScaler",
    "torch.cuda.amp.autocast": "torch.autocast",
    "torch.amp.autocast": "torch.autocast",
}


class ImportTable:
    """Maps each name bound by an import anywhere in the file to its qualified name."""

    def __init__(self, nodes: Iterable[ast.AST], pending: dict[str, str] | None = None) -> None:
        """`nodes`: every node of the file (ast.walk of its tree)."""
        self.pending: dict[str, str] = dict(pending or {})  # imports a codemod will add later
        self.aliases: dict[str, str] = dict(self.pending)
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        head = alias.name.split(".")[0]
                        self.aliases[head] = head
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualname(self, expr: ast.AST) -> str | None:
        """`nn.Linear` -> `torch.nn.Linear`; None for expressions that are not dotted names."""
        dotted = dotted_name(expr)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head)
        if base is None:
            return dotted
        return canonical(f"{base}.{rest}" if rest else base)

    def imports(self, module: str) -> bool:
        """Does the file import `module` or anything below it?"""
        return any(q == module or q.startswith(module + ".") for q in self.aliases.values())


def canonical(qualified: str) -> str:
    """Fold re-exported and synonymous torch paths onto one spelling."""
    for deep, public in _CANONICAL_PREFIXES.items():
        if qualified.startswith(deep):
            qualified = public + qualified[len(deep):]
            break
    return _SYNONYMS.get(qualified, qualified)


def dotted_name(expr: ast.AST) -> str | None:
    """`a.b.c` for a chain of attributes on a name; None otherwise."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))
