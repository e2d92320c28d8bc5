"""Hugging Face Accelerate's spellings of the DDP facts: which variables hold the `Accelerator`, and
what its attributes and methods mean (`is_main_process` a rank-0 test, `process_index` a rank,
`wait_for_everyone` a collective, `print`/`save` output made on the main process only, `prepare` the
wrap, whose model `unwrap_model` gives as `.module` does).

An Accelerate script runs one process per device as a DDP one does, so the DDP questions (ranks,
collectives, rank-0 output) read these names where a DDP script spells torch.distributed's.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.reaching import MAX_DEPTH, assignments, callers
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, LoaderSite, Ref
from ddpify.anatomy.syntax import argument
from ddpify.anatomy.values import ROLE_LOADER, ROLE_MODEL
from ddpify.anatomy.vocabulary import ACCELERATOR, ACCELERATOR_OTHER_WRAPS, ACCELERATOR_PREPARE

# Where the broadcasts live that code spelled with the Accelerator calls in place of torch.distributed's
# (`broadcast(t, from_process=0)`: a tensor, in place; `broadcast_object_list(objects, from_process=0)`).
ACCELERATE_UTILS = "accelerate.utils"
BROADCASTS = ("broadcast", "broadcast_object_list")
ACCELERATOR_GATHER_FOR_METRICS = "gather_for_metrics"  # every process's rows, the last batch's repeats dropped
# Tensor methods that keep a batch's rows (what `accelerator.gather_for_metrics` joins stays aligned
# through them), those that need a dim for it, and the counts of a batch's rows, which add up over rows.
ROW_METHODS = frozenset({"cpu", "detach", "numpy", "tolist", "float", "long", "int", "clone", "to", "view", "reshape", "flatten", "squeeze",
                         "sigmoid"})
ROW_METHODS_ALONG_A_DIM = frozenset({"argmax", "softmax", "log_softmax"})
ROW_SUMS = frozenset({"sum", "count_nonzero", "numel"})  # `(preds == y).sum()`: a sum over every row


@per_anatomy
def _accelerator_classes(a: Anatomy) -> frozenset[str]:
    """`accelerate.Accelerator` and the script's own subclasses of it."""
    own = {n.name for n in a.tree.body if isinstance(n, ast.ClassDef) and any(a.qualname(b) == ACCELERATOR for b in n.bases)}
    return frozenset({ACCELERATOR, *own})


@per_anatomy
def accelerator_refs(a: Anatomy) -> frozenset[Ref]:
    """The variables that hold an Accelerator: assigned `Accelerator(...)` (or another such variable),
    and parameters every caller hands one."""
    classes = _accelerator_classes(a)
    found: set[Ref] = set()
    for _ in range(MAX_DEPTH):
        before = len(found)
        for ref, entries in assignments(a).items():
            if any(_holds_accelerator(a, value, classes, found) for _, value in entries):
                found.add(ref)
        found |= _parameters_handed_one(a, classes, found)
        if len(found) == before:
            break
    return frozenset(found)


def _holds_accelerator(a: Anatomy, value: ast.AST, classes: frozenset[str], known: set[Ref]) -> bool:
    if isinstance(value, ast.Call):
        return a.qualname(value.func) in classes
    return isinstance(value, (ast.Name, ast.Attribute)) and a.ref(value) in known


def _parameters_handed_one(a: Anatomy, classes: frozenset[str], known: set[Ref]) -> set[Ref]:
    found = set()
    for scope, fn in a.functions.items():
        for index, name in enumerate(fn.params):
            args = [argument(call, index, name) for call in callers(a, scope)]
            if args and all(arg is not None and _holds_accelerator(a, arg, classes, known) for arg in args):
                found.add(Ref(scope, name))
    return found


def is_accelerator(a: Anatomy, expr: ast.AST) -> bool:
    """Does `expr` hold the script's Accelerator (`accelerator`, `self.accelerator`)?"""
    if isinstance(expr, ast.Call):
        return a.qualname(expr.func) in _accelerator_classes(a)
    refs = accelerator_refs(a)  # none in a script without Accelerate: no variable to look up
    return bool(refs) and isinstance(expr, (ast.Name, ast.Attribute)) and a.ref(expr) in refs


def accelerator_attribute(a: Anatomy, expr: ast.AST) -> str | None:
    """`process_index` for `accelerator.process_index`: the Accelerator's attribute `expr` reads."""
    return expr.attr if isinstance(expr, ast.Attribute) and is_accelerator(a, expr.value) else None


def accelerator_method(a: Anatomy, call: ast.AST) -> str | None:
    """`wait_for_everyone` for `accelerator.wait_for_everyone()`: the Accelerator's method `call` calls."""
    return accelerator_attribute(a, call.func) if isinstance(call, ast.Call) else None


def accelerator_spelling(a: Anatomy, scope: str) -> str | None:
    """How code in `scope` names the Accelerator: a variable of that scope, of its class, or a global."""
    cls = a.class_of_scope.get(scope)
    names = [ref.name for ref in accelerator_refs(a) if ref.scope in (scope, cls, MODULE_SCOPE)]
    return min(names, key=lambda n: (n.count("."), n)) if names else None


@per_anatomy
def _prepared(a: Anatomy) -> list[tuple[Ref, ast.Assign, ast.AST]]:
    """What `accelerator.prepare(...)` binds: each variable, the statement, and what it was handed
    (`model, opt = accelerator.prepare(model, opt)`)."""
    found = []
    for node in a.nodes:
        if not (isinstance(node, ast.Assign) and accelerator_method(a, node.value) == ACCELERATOR_PREPARE):
            continue
        for target in node.targets:
            items = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            given = node.value.args if len(items) == len(node.value.args) else []  # type: ignore[attr-defined]
            found += [(ref, node, arg) for item, arg in zip(items, given) if (ref := a.ref(item)) is not None]
    return found


@per_anatomy
def prepared_models(a: Anatomy) -> dict[Ref, list[ast.stmt]]:
    """The variables `accelerator.prepare(...)` binds a model to, and the statements that bind them."""
    found: dict[Ref, list[ast.stmt]] = {}
    for ref, stmt, handed in _prepared(a):
        if a.has_role(handed, ROLE_MODEL):
            found.setdefault(ref, []).append(stmt)
    return found


def is_prepared_loader(a: Anatomy, loader: LoaderSite) -> bool:
    """Is this DataLoader handed to `accelerator.prepare` (each process then walks its share of the batches)?"""
    if loader.call is not None and accelerator_method(a, a.parents.get(loader.call)) == ACCELERATOR_PREPARE:
        return True
    return any(ref == loader.target and a.has_role(handed, ROLE_LOADER) for ref, _, handed in _prepared(a))


@per_anatomy
def _prepare_wraps_in_ddp(a: Anatomy) -> bool:
    """Does `accelerator.prepare` wrap models in DDP: no Accelerator built with an FSDP, DeepSpeed,
    Megatron or ND-parallel option (their wrappers answer the model's attributes themselves)?"""
    classes = _accelerator_classes(a)
    return not any(kw.arg in ACCELERATOR_OTHER_WRAPS for site in a.calls if site.qualname in classes
                   for kw in site.node.keywords)  # type: ignore[attr-defined]


def is_prepared_model(a: Anatomy, expr: ast.AST) -> bool:
    """Does `expr` hold a model that `accelerator.prepare` wrapped in DDP (on several processes),
    read after the wrap (in its function) or from another function?"""
    ref = a.ref(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
    here = a.scope_of.get(expr, MODULE_SCOPE)
    return ref is not None and _prepare_wraps_in_ddp(a) and any(
        a.scope_of.get(stmt, MODULE_SCOPE) != here or stmt.lineno < expr.lineno  # type: ignore[attr-defined]
        for stmt in prepared_models(a).get(ref, ())
    )
