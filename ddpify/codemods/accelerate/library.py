"""A module the entry script imports, converted --to accelerate: the same edits, but no Accelerator
of its own (a second one, built when the module is imported, would take the Accelerate state
before the entry's mixed precision). Where the edits use the Accelerator, the module is missing
it: the conversion is incomplete until it is handed the entry's.
"""

from __future__ import annotations

import ast

from ddpify.codemods.accelerate.runtime import ACCELERATOR
from ddpify.codemods.base import Transform


class ModuleWithoutAccelerator(Transform):
    """Report an imported module that uses the Accelerator it cannot build itself."""

    NAME = "imported-module"

    def plan(self) -> None:
        uses = [node for node in self.anatomy.nodes if isinstance(node, ast.Name) and node.id == ACCELERATOR]
        if uses:
            self.missing(uses[0].lineno, f"this module, which the entry script imports, uses `{ACCELERATOR}` but has none "
                                         "(a second Accelerator, built at import, would take the entry's settings)",
                         f"hand the entry's {ACCELERATOR} to this module (an argument, or an attribute set before it is used)")
