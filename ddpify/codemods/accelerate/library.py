"""A module the entry script imports, converted --to accelerate: the same edits, but no Accelerator
of its own. Each process has one Accelerator, the entry's: the models it prepares are the ones its
backward scales and its save unwraps, and a second one, built when the module is imported, would take
the Accelerate state before the entry's options. Where the edits use the Accelerator, the module
declares `accelerator: Accelerator | None = None` after its imports, and the entry hands its own over
once built (ddpify.codemods.accelerate.handover). Used at import time, before the entry has built it,
it is missing: the conversion is incomplete.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.syntax import ancestors
from ddpify.anatomy.vocabulary import ACCELERATOR as ACCELERATOR_CLASS
from ddpify.codemods.accelerate.runtime import ACCELERATOR, HANDED_OVER
from ddpify.codemods.base import Transform
from ddpify.edits.positions import last_leading_import

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


class ModuleWithoutAccelerator(Transform):
    """Declare the entry's Accelerator in an imported module that uses it (the entry sets it once built)."""

    NAME = "imported-module"

    def plan(self) -> None:
        uses = [node for node in self.anatomy.nodes if isinstance(node, ast.Name) and node.id == ACCELERATOR]
        if not uses:
            return
        at_import = [node for node in uses if not self._run_when_called(node)]
        imports = last_leading_import(self.anatomy.tree)
        if at_import or imports is None:
            self.missing((at_import or uses)[0].lineno, f"this module, which the entry script imports, uses `{ACCELERATOR}` "
                                                        "when it is imported, before the entry has built it",
                         f"hand the entry's {ACCELERATOR} to this module (an argument, or an attribute set before it is used)")
            return
        module, name = ACCELERATOR_CLASS.rsplit(".", 1)
        self.add_import(module, name)
        self.insert_after(imports, f"\n{HANDED_OVER.format(name=name)}\n")
        self.changed(imports.lineno, f"{ACCELERATOR}: the entry script's, which it hands over once built (one per process)")

    def _run_when_called(self, node: ast.AST) -> bool:
        """Is `node` in the body of a function (not in its defaults or decorators, which run at import)?"""
        return any(child is parent.body if isinstance(parent, ast.Lambda) else child in parent.body
                   for parent, child in ancestors(self.anatomy, node) if isinstance(parent, _FUNCTIONS))
