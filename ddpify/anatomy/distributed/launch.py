"""How each process is set up: environment variable writes, `--local_rank` arguments, the process-group
backend, GPU indices fixed to an integer, and per-node downloads.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.names import DIST, DOWNLOADERS
from ddpify.anatomy.distributed.reaching import MAX_DEPTH, reaching_values
from ddpify.anatomy.sites import CallSite
from ddpify.anatomy.syntax import argument, constant, keyword, method_name


@per_anatomy
def downloads(a: Anatomy) -> list[CallSite]:
    """Calls that fetch data onto the node's disk: `MNIST(root, download=True)`, `load_dataset(...)`."""
    return [c for c in a.calls if c.qualname in DOWNLOADERS or constant(getattr(keyword(c.node, "download"), "value", None), True)]  # type: ignore[arg-type]


def env_writes(a: Anatomy, variable: str) -> list[ast.AST]:
    """`os.environ[VAR] = ...`, `os.environ.setdefault(VAR, ...)`, `os.environ.update(VAR=...)`, `os.putenv(VAR, ...)`."""
    found: list[ast.AST] = []
    for node in a.nodes:
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
