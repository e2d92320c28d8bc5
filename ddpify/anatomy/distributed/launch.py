"""How each process is set up: environment variable writes, `--local_rank` arguments, the process-group
backend, GPU indices fixed to an integer, and per-node downloads.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.names import (
    ARCHIVE_OPENERS, DIST, DOWNLOADERS, EXISTENCE_CHECKS, EXTRACTIONS, PATH_EXISTENCE_METHODS, TRANSFER_OPENERS,
    URL_READS, WRITE_MODES,
)
from ddpify.anatomy.distributed.every_rank_work import is_collective
from ddpify.anatomy.distributed.ranks import is_rank_test
from ddpify.anatomy.distributed.reaching import MAX_DEPTH, reaching_values
from ddpify.anatomy.sites import CallSite
from ddpify.anatomy.syntax import argument, constant, keyword, method_name
from ddpify.anatomy.vocabulary import OPEN_CALLS


@per_anatomy
def downloads(a: Anatomy) -> list[CallSite]:
    """Calls that fetch data onto the node's disk: `MNIST(root, download=True)`, `load_dataset(...)`,
    `tar.extractall()`, and `requests.get(url)` in a statement that writes what it reads to a file."""
    return [c for c in a.calls if _stores_files(c) or (c.qualname in URL_READS and _writes_files(a, download_unit(a, c.stmt)))]


@per_anatomy
def _download_units(a: Anatomy) -> frozenset[ast.stmt]:
    """Where the script's downloads run. Their file writes store the download: a duty of each disk, done once
    on each, not rank 0's output (on another node's own disk, files rank 0 alone wrote are missing)."""
    return frozenset(download_unit(a, c.stmt) for c in downloads(a))


def download_of(a: Anatomy, node: ast.AST) -> ast.stmt | None:
    """The download unit (`download_unit`) `node` is part of, if any."""
    units = _download_units(a)
    return next((stmt for stmt in (node, *a.enclosing(node, ast.stmt)) if stmt in units), None) if units else None


def one_rank_goes_first(a: Anatomy, unit: ast.stmt) -> bool:
    """Does `unit` come right after `if <rank test>: dist.barrier()` (or `accelerator.wait_for_everyone()`), so
    that one rank of each node runs it while the others wait (how PerNodeDownloads sequences a download, or a
    script by hand)?"""
    before = _statement_before(a, unit)
    return (isinstance(before, ast.If) and is_rank_test(a, before.test)
            and any(is_collective(a, node) for stmt in before.body for node in ast.walk(stmt)))


def _statement_before(a: Anatomy, stmt: ast.stmt) -> ast.stmt | None:
    parent = a.parents.get(stmt)
    for body in (getattr(parent, field, None) for field in ("body", "orelse", "finalbody")):
        if isinstance(body, list) and stmt in body:
            index = body.index(stmt)
            return body[index - 1] if index else None
    return None


def _stores_files(c: CallSite) -> bool:
    call: ast.Call = c.node  # type: ignore[assignment]
    return c.qualname in DOWNLOADERS or method_name(call) in EXTRACTIONS or constant(getattr(keyword(call, "download"), "value", None), True)


def _writes_files(a: Anatomy, unit: ast.stmt) -> bool:
    """Does `unit` open a file for writing, or store a download or an archive's contents?"""
    inside = set(ast.walk(unit))
    return any(c.node in inside and (_stores_files(c) or _opens_for_writing(c)) for c in a.calls)


def _opens_for_writing(c: CallSite) -> bool:
    mode = argument(c.node, 1, "mode")  # type: ignore[arg-type]
    return c.qualname in OPEN_CALLS and isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(WRITE_MODES & set(mode.value))


def download_unit(a: Anatomy, stmt: ast.stmt) -> ast.stmt:
    """The statement that runs on one rank at a time around a download in `stmt`: with the `with` blocks that
    stream it (`with requests.get(url) as r:`) and the `if`s that skip it when its files exist."""
    parent = a.parents.get(stmt)
    while (_streams_a_download(a, parent) or (isinstance(parent, ast.If) and _checks_existence(a, parent.test))) and not _holds_training(a, parent):
        stmt, parent = parent, a.parents.get(parent)
    return stmt


def _streams_a_download(a: Anatomy, stmt: ast.AST | None) -> bool:
    """`with requests.get(url) as r, open(path, "wb") as f:`, `with tarfile.open(...) as tar:`."""
    if not isinstance(stmt, ast.With):
        return False
    opened = [a.qualname(item.context_expr.func) if isinstance(item.context_expr, ast.Call) else None for item in stmt.items]
    return all(name in TRANSFER_OPENERS for name in opened) and any(name in URL_READS | ARCHIVE_OPENERS for name in opened)


def _holds_training(a: Anatomy, stmt: ast.stmt) -> bool:
    """Does `stmt` build a model, loop over steps, or call this file's functions (which may train)?
    Run on local rank 0 alone, its collectives would wait for ranks held at the barrier."""
    inside = set(ast.walk(stmt))
    sites = [*a.models, *a.step_loops, *a.epoch_loops]
    return any(s.node in inside for s in sites) or any(c.node in inside and c.qualname in a.functions for c in a.calls)


def _checks_existence(a: Anatomy, test: ast.expr) -> bool:
    """`os.path.exists(p)`, `not Path(p).is_file()`, combined with `and`/`or`: whether files are there already."""
    return any(
        isinstance(node, ast.Call) and (a.qualname(node.func) in EXISTENCE_CHECKS or method_name(node) in PATH_EXISTENCE_METHODS)
        for node in ast.walk(test)
    )


def env_writes(a: Anatomy, variable: str) -> list[ast.AST]:
    """`os.environ[VAR] = ...`, `os.environ.setdefault(VAR, ...)`, `os.environ.update(VAR=...)`, `os.putenv(VAR, ...)`."""
    found: list[ast.AST] = []
    for node in a.nodes_of(ast.Subscript, ast.Call):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if a.qualname(node.value) == "os.environ" and constant(node.slice, variable):
                found.append(node)
        elif isinstance(node, ast.Call):
            q = a.qualname(node.func)
            if q in ("os.environ.setdefault", "os.putenv", "os.environ.__setitem__") and node.args and constant(node.args[0], variable):
                found.append(node)
            elif q == "os.environ.update" and _names_variable(node, variable):
                found.append(node)
    return found


def _names_variable(call: ast.Call, variable: str) -> bool:
    if any(kw.arg == variable for kw in call.keywords):
        return True
    return any(isinstance(arg, ast.Dict) and any(constant(k, variable) for k in arg.keys) for arg in call.args)


@per_anatomy
def local_rank_arguments(a: Anatomy) -> list[CallSite]:
    """`parser.add_argument("--local_rank", ...)` (the torch.distributed.launch convention)."""
    return [
        c for c in a.calls
        if method_name(c.node) == "add_argument"
        and any(constant(arg, "--local_rank", "--local-rank") for arg in c.node.args)  # type: ignore[attr-defined]
    ]


def backends(a: Anatomy) -> list[tuple[CallSite, ast.AST | None]]:
    """Each `init_process_group(...)` call with its backend expression (None: the default)."""
    return [(c, argument(c.node, 0, "backend")) for c in a.calls_to(f"{DIST}.init_process_group")]  # type: ignore[arg-type]


def holds_integer(a: Anatomy, expr: ast.AST, depth: int = 0) -> bool:
    """Is `expr` an int literal, or a variable only ever given one (`gpu = 0`, `self.gpu_id`
    set from a caller's `0`, `args.gpu` from an `add_argument(..., type=int)` option)?"""
    if depth > MAX_DEPTH:
        return False
    if isinstance(expr, ast.Constant):
        return type(expr.value) is int
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.attr in _integer_options(a):
        return True
    if isinstance(expr, (ast.Name, ast.Attribute)):
        values = reaching_values(a, expr)
        return bool(values) and all(holds_integer(a, v, depth + 1) for v in values)
    return False


@per_anatomy
def _integer_options(a: Anatomy) -> set[str]:
    """The `args.<dest>` names of argparse options declared `type=int` or with an int default."""
    found = set()
    for c in a.calls:
        call: ast.Call = c.node  # type: ignore[assignment]
        if method_name(call) != "add_argument" or not call.args or not isinstance(call.args[0], ast.Constant):
            continue
        kind, default = keyword(call, "type"), keyword(call, "default")
        if (kind is not None and isinstance(kind.value, ast.Name) and kind.value.id == "int") or (
            default is not None and constant(default.value, *range(-1, 16))
        ):
            dest = keyword(call, "dest")
            name = dest.value.value if dest is not None and isinstance(dest.value, ast.Constant) else str(call.args[0].value)
            found.add(name.lstrip("-").replace("-", "_"))
    return found
