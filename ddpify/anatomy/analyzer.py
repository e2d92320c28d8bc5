"""Find a training script's anatomy once, for the codemods and the lint rules alike.

The analysis runs on Python's `ast` (a C parser, ~30x faster than building a LibCST tree), and
every fact carries a LibCST-style position, so a codemod finds the CST node at the same place.
Building the `Anatomy` walks the tree once (ddpify.anatomy.tree); then three passes fill it, in
this order: the index of classes and calls (ddpify.anatomy.index), the value flow through
assignments, `self.attr`, arguments and return values (ddpify.anatomy.value_flow), and the loops
that train (ddpify.anatomy.loops). What the anatomy answers lives in ddpify.anatomy.script.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.facts import NO_FACTS, ProjectFacts
from ddpify.anatomy.index import build_index
from ddpify.anatomy.loops import find_loops
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.value_flow import flow_values


def analyze(text: str, path: str = "<string>", tree: ast.Module | None = None, pending_imports: dict[str, str] | None = None,
            facts: ProjectFacts = NO_FACTS) -> Anatomy:
    """Parse `text` (unless `tree` is given) and find its anatomy.

    `pending_imports` maps local names to qualified names for imports a codemod will add later;
    `facts` is what the file's project says about names it imports and callers it has elsewhere.
    """
    tree = ast.parse(text, filename=path) if tree is None else tree
    anatomy = Anatomy(text, path, tree, pending_imports, facts)
    build_index(anatomy)
    flow_values(anatomy)
    find_loops(anatomy)
    return anatomy
