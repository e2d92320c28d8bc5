"""A training project: entry scripts and the local modules they import, analyzed together.

Python runs `python train.py` with train.py's directory first on sys.path, so `from model import Net`,
`import utils` and `from data.loader import get_loader` name files of the project when those files
exist under that directory (or under the parent of the package that holds the entry); failing that,
under a directory the entry adds to `sys.path` or the repository root (ddpify.anatomy.search_path).
Everything else (torch, site-packages) is not the project's and is never followed; an import found
nowhere, not even installed, is kept as `unresolved`: training may live there.

Each file keeps its own analysis (ddpify.anatomy.analyze); this layer only connects them. It
resolves the names each file imports, and repeats: analyze every file with what it knows of the
others (ProjectFacts), then derive new facts from those analyses, until nothing changes.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

from ddpify.anatomy.analyzer import analyze
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.trained_models import any_batchnorm
from ddpify.anatomy.values import ROLE_LOADER, ROLE_MODEL
from ddpify.anatomy.distributed.every_rank_work import may_do_work_off_rank_zero
from ddpify.anatomy.distributed.samplers import epochs_numbered_here
from ddpify.anatomy.passed_in import parameters_reaching
from ddpify.anatomy.facts import EPOCHS, EVALUATES, NO_FACTS, STEPS, Exported, Incoming, ProjectFacts
from ddpify.anatomy.scatter_gather import replica_facts
from ddpify.anatomy.search_path import editable_root, extra_roots, installed
from ddpify.anatomy.sites import CallSite, LoaderSite, ModelSite

MAX_ROUNDS = 6
MAX_HANDOFFS = 3  # files an instance may be passed through (`model = GPT()` -> `Trainer(model)` -> `self.model`)
_MAX_REEXPORTS = 4


@dataclass
class ModuleFile:
    """One Python file of the project, under the dotted name the project's code imports it by."""

    name: str
    path: Path
    text: str
    tree: ast.Module
    relative: dict[str, str] = field(default_factory=dict)  # local name -> absolute dotted name (relative imports)
    facts: ProjectFacts = NO_FACTS
    anatomy: Anatomy = None  # type: ignore[assignment]

    @property
    def package(self) -> str:
        """The package a relative import in this file starts from."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]

    def analyze(self) -> None:
        self.anatomy = analyze(self.text, str(self.path), tree=self.tree, facts=self.facts)


def is_entry_point(anatomy: Anatomy) -> bool:
    """A script someone runs: it has a `__main__` block, or trains at module level."""
    return anatomy.main_guard is not None or anatomy.has_top_level_training


def import_roots(entry: Path) -> list[Path]:
    """Where the entry's absolute imports are found: its directory, then the parent of its top package
    (spelled from the entry's directory, `pkg/..`, so paths stay as the user gave them)."""
    roots = [entry.parent]
    top, levels = entry.parent.resolve(), 0
    while (top / "__init__.py").is_file() and top.parent != top:
        top, levels = top.parent, levels + 1
    if levels:
        roots.append(entry.parent.joinpath(*[os.pardir] * levels))
    return roots


def within(path: Path, root: Path) -> Path:
    """`path` relative to `root` (which may be spelled with `..`)."""
    return Path(os.path.relpath(path, root))


class Project:
    """Entry scripts plus every local module they import (directly or through each other)."""

    def __init__(self, entries: list[Path], read) -> None:
        """`read(path)` returns a file's text or raises; files that can't be read are left out."""
        self.entries = entries
        self.roots = import_roots(entries[0])
        self.unresolved: dict[Path, list[ast.stmt]] = {}  # an entry's imports of modules found nowhere
        self._read = read
        self._extra_roots = self._search_beyond(entries[0])
        self.modules: dict[str, ModuleFile] = {}
        self.unreadable: dict[Path, Exception] = {}
        self._imports: dict[Path, set[Path]] = {}
        for entry in entries:
            self._load(entry, entry.stem if entry.parent == self.roots[0] else self._name_of(entry))
        self._analyze()

    # ----- finding the files -------------------------------------------------------------------
    @property
    def root(self) -> Path:
        """The outermost import root: a mirror of the project copies what lies under it."""
        return self.roots[-1]

    def files(self) -> list[ModuleFile]:
        return list(self.modules.values())

    def is_entry(self, module: ModuleFile) -> bool:
        return module.path in self.entries

    def _name_of(self, path: Path) -> str:
        relative = within(path, self.root).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        return ".".join(parts)

    def _load(self, path: Path, name: str) -> None:
        if any(m.path == path for m in self.modules.values()) or path in self.unreadable:
            return
        try:
            text = self._read(path)
            tree = ast.parse(text, filename=str(path))
        except Exception as error:  # a broken library: the entry is converted without its facts
            self.unreadable[path] = error
            return
        module = ModuleFile(name, path, text, tree)
        self.modules[name] = module
        if path in self.entries:
            self.unresolved[path] = self._imports_found_nowhere(module)
        for dotted in self._imported_modules(module):
            found = self._find_module(dotted)
            if found is not None:
                self._imports.setdefault(path, set()).add(found)
                self._load(found, dotted)

    def imports_of(self, module: ModuleFile) -> set[Path]:
        """The project files `module` imports directly."""
        return self._imports.get(module.path, set())

    def _connected(self, module: ModuleFile, loaded: set[Path]) -> set[Path]:
        """The files linked to `module` by imports, either way (scripts side by side in one directory are not)."""
        edges: dict[Path, set[Path]] = {}
        for importer, imported in self._imports.items():
            for path in imported:
                edges.setdefault(importer, set()).add(path)
                edges.setdefault(path, set()).add(importer)
        seen, todo = {module.path}, [module.path]
        while todo:
            for path in edges.get(todo.pop(), ()):
                if path not in seen and path in loaded:
                    seen.add(path)
                    todo.append(path)
        return seen

    def _find_module(self, dotted: str) -> Path | None:
        """The file of `dotted` under the import roots, or under a root beyond them (which then joins them)."""
        for root in [*self.roots, *self._extra_roots]:
            base = root.joinpath(*dotted.split("."))
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    self._use_root(root)
                    return candidate
        editable = editable_root(dotted.partition(".")[0], self.entries[0])
        if editable is not None and editable not in [*self.roots, *self._extra_roots]:
            self._extra_roots.append(editable)
            return self._find_module(dotted)
        return None

    def _search_beyond(self, entry: Path) -> list[Path]:
        try:
            tree = ast.parse(self._read(entry), filename=str(entry))
        except Exception:  # reported when the entry itself is loaded
            return []
        known = {r.resolve() for r in self.roots}
        return [r for r in extra_roots(entry, tree) if r.resolve() not in known]

    def _use_root(self, root: Path) -> None:
        """Search `root` with the others from now on, the outermost last (it holds the mirror)."""
        if root in self._extra_roots:
            self._extra_roots.remove(root)
            self.roots = sorted([*self.roots, root], key=lambda r: -len(r.resolve().parts))

    def _imports_found_nowhere(self, module: ModuleFile) -> list[ast.stmt]:
        """The absolute imports of `module` whose top-level package is neither a project file nor installed."""
        return [node for node in ast.walk(module.tree) if any(self._found_nowhere(name) for name in _absolute_imports(node))]

    def _found_nowhere(self, dotted: str) -> bool:
        top = dotted.partition(".")[0]
        return self._find_module(top) is None and not installed(top)

    def _imported_modules(self, module: ModuleFile) -> list[str]:
        """Dotted names of every module this file's imports may load (packages on the way included)."""
        names: list[str] = []
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    names += _prefixes(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(module, node)
                if base is None:
                    continue
                names += _prefixes(base)
                for alias in node.names:
                    names.append(f"{base}.{alias.name}")
                    if node.level:
                        module.relative[alias.asname or alias.name] = f"{base}.{alias.name}"
        return names

    def _absolute(self, module: ModuleFile, node: ast.ImportFrom) -> str | None:
        if not node.level:
            return node.module
        package = module.package.split(".") if module.package else []
        if node.level - 1 > len(package):
            return None
        base = package[: len(package) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])]) or None

    # ----- resolving names across files --------------------------------------------------------
    def resolve(self, module: ModuleFile, qualname: str, depth: int = 0) -> tuple[ModuleFile, str] | None:
        """The project file that defines what `qualname` (as `module` spells it) names, and its name there."""
        head, _, rest = qualname.partition(".")
        if head in module.relative:
            qualname = module.relative[head] + (f".{rest}" if rest else "")
        owner, _, attr = qualname.rpartition(".")
        target = self.modules.get(owner)
        if target is None or not attr or depth > _MAX_REEXPORTS:
            return None
        if _defines(target.tree, attr):
            return target, attr
        reexported = _imported_as(target, attr)  # `from .core import Trainer` in a package's __init__
        return self.resolve(target, reexported, depth + 1) if reexported else None

    # ----- the fixpoint ------------------------------------------------------------------------
    def _analyze(self) -> None:
        changed = self.files()
        for _ in range(MAX_ROUNDS):
            for module in changed:
                module.analyze()
            new_facts = {m.name: self._facts_for(m) for m in self.files()}
            changed = [m for m in self.files() if new_facts[m.name] != m.facts]
            if not changed:
                return
            for module in changed:
                module.facts = new_facts[module.name]

    def resolve_call(self, module: ModuleFile, call: CallSite) -> tuple[ModuleFile, str] | None:
        """What a call runs: a function or class of another file, or a method of an instance of one
        (`trainer = Trainer(...)` then `trainer.fit(loader)` runs `Trainer.fit`)."""
        found = self.resolve(module, call.qualname)
        func = call.node.func  # type: ignore[attr-defined]
        if found is not None or not isinstance(func, ast.Attribute):
            return found
        owner = self._instance_class(module, func.value)
        method = f"{owner[1]}.{func.attr}" if owner else ""
        return (owner[0], method) if owner and method in owner[0].anatomy.functions else None

    def _instance_class(self, module: ModuleFile, receiver: ast.AST, depth: int = 0) -> tuple[ModuleFile, str] | None:
        """The class of another file whose instance `receiver` is: built right there (`Engine(model).fit(...)`),
        assigned to it, or passed in by callers in other files (`self.model` of `Trainer(config, model)`)."""
        ref = module.anatomy.ref(receiver) if isinstance(receiver, (ast.Name, ast.Attribute)) else None
        values = [getattr(stmt, "value", None) for stmt in module.anatomy._assignments_to(ref)] if ref else [receiver]
        for value in values:
            found = self.resolve(module, module.anatomy.qualname(value.func) or "") if isinstance(value, ast.Call) else None
            if found is not None and found[1] in found[0].anatomy.class_of_scope:
                return found
        return self._class_passed_in(module, receiver, depth) if depth < MAX_HANDOFFS else None

    def _class_passed_in(self, module: ModuleFile, receiver: ast.AST, depth: int) -> tuple[ModuleFile, str] | None:
        """The class of the instances that calls in other files pass to the parameter `receiver` holds."""
        for scope, param in parameters_reaching(module.anatomy, receiver):
            for other in self.files():
                calls = [c for c in other.anatomy.calls if other is not module and self._calls_scope(other, c, module, scope)]
                passed = [arg for c in calls for p, arg in _bound_arguments(module.anatomy.functions[scope].params, c.node) if p == param]  # type: ignore[arg-type]
                found = next((f for arg in passed if (f := self._instance_class(other, arg, depth + 1))), None)
                if found is not None:
                    return found
        return None

    def _calls_scope(self, caller: ModuleFile, call: CallSite, module: ModuleFile, scope: str) -> bool:
        """Does `call`, in `caller`, run the function `scope` of `module` (a class's call: its __init__)?"""
        found = self.resolve(caller, call.qualname) if call.qualname else None
        return found is not None and found[0] is module and _callee_scope(module.anatomy, found[1]) == scope

    def _facts_for(self, module: ModuleFile) -> ProjectFacts:
        imported = {}
        resolved = {c.qualname: self.resolve_call(module, c) for c in module.anatomy.calls if c.qualname}
        for qualname in _names_used(module):
            found = resolved.get(qualname) or self.resolve(module, qualname)
            if found is not None and found[0] is not module:
                exported = _exported(found[0].anatomy, found[1])
                if exported is not None:
                    imported[qualname] = exported
        params, returned, trained = self._callers_of(module)
        by_path = {m.path: m for m in self.files()}
        others = [by_path[path].anatomy for path in self._connected(module, set(by_path)) - {module.path}]
        return ProjectFacts(imported=imported, params=params, returned_elsewhere=frozenset(returned),
                            trained_returns=frozenset(trained), models_trained_elsewhere=any(a.trained_models for a in others),
                            data_loaded_elsewhere=any(a.train_loaders for a in others))

    def _callers_of(self, module: ModuleFile):
        """What other files pass to this file's functions, and which of its returned loaders they use."""
        incoming: dict[str, dict[str, list[Incoming]]] = {}
        returned: set[str] = set()
        trained: set[str] = set()
        for other in self.files():
            if other is module:
                continue
            for call in other.anatomy.calls:
                found = self.resolve_call(other, call)
                if found is None or found[0] is not module:
                    continue
                scope = _callee_scope(module.anatomy, found[1])
                if scope is None:
                    continue
                for param, arg in _bound_arguments(module.anatomy.functions[scope].params, call.node):  # type: ignore[arg-type]
                    incoming.setdefault(scope, {}).setdefault(param, []).append(_incoming(other.anatomy, arg, call.node))
            for loader in other.anatomy.foreign_loaders:
                found = self.resolve(other, other.anatomy.qualname(loader.call.func) or "") if loader.call else None
                if found is not None and found[0] is module:
                    returned.add((found[1], loader.index))
                    if loader.is_train:
                        trained.add((found[1], loader.index))
        params = {scope: {p: _merged(found) for p, found in by_param.items()} for scope, by_param in incoming.items()}
        return {s: {p: i for p, i in by.items() if i.roles} for s, by in params.items()}, returned, trained


def _absolute_imports(node: ast.AST) -> list[str]:
    """The modules an `import a.b` or `from a.b import c` statement names (none for a relative import)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level and node.module:
        return [node.module]
    return []


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _defines(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name for n in tree.body)


def _imported_as(module: ModuleFile, name: str) -> str | None:
    """The dotted name a module re-exports `name` from (`from .core import name`, `from pkg.core import name`)."""
    if name in module.relative:
        return module.relative[name]
    aliased = module.anatomy.names.aliases.get(name) if module.anatomy else None
    return aliased if aliased and aliased != name else None


def _names_used(module: ModuleFile) -> set[str]:
    """Qualified names this file calls, subclasses or mentions (`MODELS = {"cnn": ConvNet}`) through its
    imports: the candidates for names of other project files."""
    anatomy = module.anatomy
    used = {c.qualname for c in anatomy.calls if c.qualname}
    imported = set(anatomy.names.aliases) | set(module.relative)
    used.update(anatomy.qualname(n) or n.id for n in ast.walk(module.tree) if isinstance(n, ast.Name) and n.id in imported)
    for node in anatomy.tree.body:
        if isinstance(node, ast.ClassDef):
            used.update(q for q in (anatomy.qualname(b) for b in node.bases) if q)
    return used


def _callee_scope(anatomy: Anatomy, name: str) -> str | None:
    """The function a call of `name` runs: the function itself, or a class's __init__."""
    for scope in (name, f"{name}.__init__"):
        if scope in anatomy.functions:
            return scope
    return None


def _exported(anatomy: Anatomy, name: str) -> Exported | None:
    """What a call of `name`, defined in `anatomy`'s file, returns and trains on."""
    scope = _callee_scope(anatomy, name)
    params = tuple(anatomy.functions[scope].params) if scope else ()
    trains = tuple(sorted(_loader_params(anatomy, scope))) if scope else ()
    model_class = anatomy.model_classes.get(name)
    if model_class is not None:
        return Exported(frozenset({ROLE_MODEL}), (), model_class.has_batchnorm, params, trains, is_model_class=True,
                        replica=replica_facts(anatomy, name))
    if scope is None and name not in anatomy.class_of_scope:
        return None
    returned = anatomy.returns.get(name, set()) if scope == name else set()
    batchnorm = any_batchnorm(o.has_batchnorm for r, o in returned if r == ROLE_MODEL and isinstance(o, ModelSite))
    safe = scope is not None and not may_do_work_off_rank_zero(anatomy, scope)
    loaders = [o for r, o in returned if r == ROLE_LOADER]
    unshuffled = bool(loaders) and all(isinstance(o, LoaderSite) and not anatomy.loader_shuffles(o) for o in loaders)
    return Exported(frozenset(r for r, _ in returned), _items(anatomy, name) if scope == name else (), batchnorm, params, trains,
                    rank_zero_safe=safe, unshuffled=unshuffled)


def _items(anatomy: Anatomy, scope: str) -> tuple[frozenset[str], ...]:
    """The roles of each item of the tuple `scope` returns."""
    count = 1 + max((i for s, i in anatomy.item_returns if s == scope), default=-1)
    return tuple(frozenset(r for r, _ in anatomy.item_returns.get((scope, i), ())) for i in range(count))


def _loader_params(anatomy: Anatomy, scope: str) -> set[tuple[str, str]]:
    """Parameters of `scope` holding a loader that this file iterates: trained on (and who loops over its
    epochs), or only evaluated."""
    out = set()
    iterated = {loader for loop in anatomy.step_loops for loader in loop.loaders}
    for loader in anatomy.foreign_loaders:
        if loader.call is not None or loader.target.scope != scope:  # type: ignore[union-attr]
            continue
        if loader.is_train:
            out.add((loader.target.name, EPOCHS if epochs_numbered_here(anatomy, loader) else STEPS))  # type: ignore[union-attr]
        elif loader in iterated:
            out.add((loader.target.name, EVALUATES))  # type: ignore[union-attr]
    return out


def _bound_arguments(params: list[str], call: ast.Call) -> list[tuple[str, ast.AST]]:
    bound = [(p, a) for p, a in zip(params, call.args) if not isinstance(a, ast.Starred)]
    bound += [(kw.arg, kw.value) for kw in call.keywords if kw.arg in params]
    return bound  # type: ignore[return-value]


def _incoming(anatomy: Anatomy, arg: ast.AST, call: ast.AST) -> Incoming:
    roles = anatomy.roles(arg)
    batchnorm = any_batchnorm(o.has_batchnorm for r, o in roles if r == ROLE_MODEL and isinstance(o, ModelSite))
    return Incoming(frozenset(r for r, _ in roles), batchnorm, _wrapped_at(anatomy, arg, call))


def _wrapped_at(anatomy: Anatomy, arg: ast.AST, call: ast.AST) -> bool:
    """Is `arg` a model that this file wraps in DDP before `call` (or that arrived here wrapped)?"""
    if anatomy.origins(arg, ROLE_MODEL) & anatomy.wrapped_elsewhere:  # type: ignore[operator]
        return True
    ref = anatomy.ref(arg) if isinstance(arg, (ast.Name, ast.Attribute)) else None
    for model in anatomy.trained_models if ref is not None else ():
        if model.target == ref:
            return model.scope != anatomy.scope_of.get(call) or model.stmt.lineno < call.lineno  # type: ignore[attr-defined]
    return False


def _merged(found: list[Incoming]) -> Incoming:
    """One parameter called from several places: any role it may hold; wrapped only if always wrapped."""
    roles = frozenset().union(*(i.roles for i in found))
    return Incoming(roles, any_batchnorm(i.has_batchnorm for i in found), all(i.wrapped for i in found))
