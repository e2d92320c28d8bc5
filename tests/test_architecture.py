"""The import graph of ddpify/ and rules/, read with `ast`: no import cycle between modules, and each
module imports only from its own layer or the layers below it (docs/architecture.md draws them).

Every import counts: at the top of a module, inside a function (the lazy imports that keep start-up
fast are still arrows) and under `if TYPE_CHECKING:`. An import of `a.b.c` is an arrow to the module
`a/b/c.py` (or the package `a/b/c/__init__.py`) alone, not to the packages above it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"ddpify": "ddpify", "ddpify.rules": "rules"}  # dotted name -> its folder (rules ship as ddpify.rules)

# The layers, lowest first. A module may import from its own part and from the layers below its
# layer; never from a layer above, nor from another part of its own layer (lint and the transforms
# share the edit toolkit below them and never reach into each other). A part is folders (ending
# in "/", with everything in them) and files.
LAYERS: list[dict[str, tuple[str, ...]]] = [
    {"foundations": ("ddpify/__init__.py", "ddpify/exit_codes.py", "ddpify/sources.py", "ddpify/python_files.py", "ddpify/notebooks.py",
                     "ddpify/collector.py")},
    {"analysis": ("ddpify/anatomy/",)},
    {"edit toolkit": ("ddpify/edits/",)},
    {"lint": ("ddpify/lint/", "rules/"), "transforms": ("ddpify/codemods/",)},
    {"conversion": ("ddpify/convert.py", "ddpify/project_conversion.py", "ddpify/review.py")},
    {"verify": ("ddpify/verify/",), "server": ("ddpify/server.py",)},
    {"CLI": ("ddpify/commands/", "ddpify/cli.py", "ddpify/__main__.py", "ddpify/mcp_server.py")},
]

# What the layers above must keep true, whatever else moves: (importer, imported) folders.
NEVER = [
    ("rules/", "ddpify/codemods/"),
    ("rules/", "ddpify/commands/"),
    ("ddpify/lint/", "ddpify/codemods/"),
    *(("ddpify/anatomy/", above) for above in ("ddpify/codemods/", "ddpify/commands/", "ddpify/lint/", "ddpify/verify/")),
    ("ddpify/verify/", "ddpify/commands/"),
]


def module_files(root: Path = ROOT, packages: dict[str, str] = PACKAGES) -> dict[str, str]:
    """Dotted module name -> its path relative to `root`, for every .py file of the packages."""
    found = {}
    for dotted, folder in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            name = ".".join((dotted, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            found[name] = path.relative_to(root).as_posix()
    return found


def imported_modules(tree: ast.Module, package: str, modules: dict[str, str]) -> set[str]:
    """The modules (of `modules`) a module's import statements name: `import a.b` names a.b; `from
    a import b` names the module a.b where there is one, else a (b is defined in a). `package`: the
    module's package, for relative imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            names.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return names & modules.keys()


def import_graph(root: Path = ROOT, packages: dict[str, str] = PACKAGES) -> dict[str, set[str]]:
    """File -> the files of the packages it imports."""
    modules = module_files(root, packages)
    graph = {}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        graph[path] = {modules[target] for target in imported_modules(tree, package, modules)} - {path}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(path: str) -> tuple[int, str] | None:
    """(layer index, part name) of a file; None when no layer names it."""
    for number, parts in enumerate(LAYERS):
        for part, places in parts.items():
            if any(path == place or (place.endswith("/") and path.startswith(place)) for place in places):
                return number, part
    return None


def wrong_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Each import that goes up a layer or across to another part of the same layer."""
    wrong = []
    for importer, targets in sorted(graph.items()):
        mine = layer_of(importer)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine and theirs and (theirs[0] > mine[0] or (theirs[0] == mine[0] and theirs[1] != mine[1])):
                wrong.append(f"{importer} ({mine[1]}) imports {target} ({theirs[1]})")
    return wrong


@functools.cache
def graph() -> dict[str, set[str]]:
    """This checkout's import graph, read when a test first asks (1.1 s: not at every worker's collection)."""
    return import_graph()


def test_every_module_has_a_layer_and_every_layer_its_modules():
    unplaced = [path for path in sorted(graph()) if layer_of(path) is None]
    assert not unplaced, f"give these a layer in LAYERS (and docs/architecture.md): {unplaced}"
    places = [place for parts in LAYERS for places in parts.values() for place in places]
    stale = [place for place in places if not any(path == place or path.startswith(place) and place.endswith("/") for path in graph())]
    assert not stale, f"LAYERS names what is not there: {stale}"


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(cycle) for cycle in found)


def test_imports_follow_the_layers():
    wrong = wrong_arrows(graph())
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


@pytest.mark.parametrize("importer, imported", NEVER)
def test_never_imports(importer, imported):
    arrows = [f"{a} imports {b}" for a, targets in sorted(graph().items()) if a.startswith(importer) for b in sorted(targets) if b.startswith(imported)]
    assert not arrows, "\n".join(arrows)


def test_the_reader_counts_imports_in_functions_and_for_type_checking_and_finds_a_cycle(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for path, text in {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    from pkg.b import g\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import sub\n",
        "pkg/sub/__init__.py": "from .c import h\n",
        "pkg/sub/c.py": "import pkg.a\n",
    }.items():
        (tmp_path / path).write_text(text)
    graph = import_graph(tmp_path, {"pkg": "pkg"})
    assert graph == {"pkg/__init__.py": set(), "pkg/a.py": {"pkg/b.py"}, "pkg/b.py": {"pkg/sub/__init__.py"},
                     "pkg/sub/__init__.py": {"pkg/sub/c.py"}, "pkg/sub/c.py": {"pkg/a.py"}}
    assert cycles(graph) == [["pkg/a.py", "pkg/b.py", "pkg/sub/__init__.py", "pkg/sub/c.py"]]


def test_an_arrow_up_or_across_a_layer_is_wrong():
    graph = {"ddpify/anatomy/x.py": {"ddpify/edits/y.py"}, "rules/r.py": {"ddpify/codemods/t.py", "ddpify/edits/y.py"},
             "ddpify/commands/c.py": {"ddpify/verify/v.py"}}
    assert wrong_arrows(graph) == ["ddpify/anatomy/x.py (analysis) imports ddpify/edits/y.py (edit toolkit)",
                                   "rules/r.py (lint) imports ddpify/codemods/t.py (transforms)"]
