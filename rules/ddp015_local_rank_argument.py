"""DDP015: the rank taken from a `--local_rank` argument (torch.distributed.launch)."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.launch import local_rank_arguments
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit, int_from_environment


class LocalRankArgument(Rule, code="DDP015", name="local-rank-argument", severity="warning"):
    """## What it does
    Flags `parser.add_argument("--local_rank", ...)` (or `"--local-rank"`): the convention of the
    deprecated `python -m torch.distributed.launch`, which passed the local rank on the command line.
    An argument whose default reads the `LOCAL_RANK` environment variable is not reported.

    ## Why is this bad?
    `torchrun` (and `torch.distributed.launch` since it became a wrapper of it) sets the
    `LOCAL_RANK` environment variable and passes no argument, so the argument keeps its default:
    with the usual `default=-1` the script believes it is not distributed, or every rank picks
    GPU 0. With `torch.distributed.launch` on torch >= 2.0 the argument is spelled `--local-rank`,
    and a parser that only knows `--local_rank` exits with "unrecognized arguments".

    ## Example
    ```python
    parser.add_argument("--local_rank", type=int, default=-1)
    ```

    ## Use instead
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    ```
    or, to keep the argument working with both launchers,
    `parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))`.

    ## Fix safety
    Unsafe: when the default is an integer literal, it becomes
    `int(os.environ.get("LOCAL_RANK", <old default>))`, which changes the value the script sees
    under torchrun (the point of the fix, but code that relied on the default changes path).
    No fix when `os` is not imported or the default is not an integer literal.
    """

    message = "`--local_rank` argument: torchrun passes LOCAL_RANK in the environment, not as an argument"

    def check(self, a):
        for site in local_rank_arguments(a):
            if not _defaults_to_environment(site.node):
                yield Finding(site.pos, fix=_fix(a, site.node))


def _defaults_to_environment(call: ast.Call) -> bool:
    """`default=int(os.environ.get("LOCAL_RANK", -1))`: works under torchrun too."""
    default = syntax.keyword(call, "default")
    return default is not None and syntax.contains(default.value, lambda n: syntax.constant(n, "LOCAL_RANK"))


def _fix(a, call: ast.Call) -> Fix | None:
    default = syntax.keyword(call, "default")
    environ = syntax.spelling(a, "os.environ")
    if default is None or environ is None or not _is_int_literal(default.value):
        return None
    edit = expression_edit(a, default.value, lambda value: int_from_environment(value, environ, "LOCAL_RANK"))
    return Fix((edit,), safe=False, description="default to the LOCAL_RANK environment variable") if edit else None


def _is_int_literal(expr: ast.AST) -> bool:
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        expr = expr.operand
    return isinstance(expr, ast.Constant) and type(expr.value) is int


_HEAD = """import argparse
import os
import torch.distributed as dist

parser = argparse.ArgumentParser()
"""


def _parsing(arguments: str) -> str:
    """A script whose parser gets `parser.add_argument(<arguments>)` on line 6."""
    return f"{_HEAD}parser.add_argument({arguments})\nargs = parser.parse_args()\ndist.init_process_group('nccl')\n"


LocalRankArgument.VALID = (
    _parsing("'--local_rank', type=int, default=int(os.environ.get('LOCAL_RANK', -1))"),
    _HEAD + "parser.add_argument('--epochs', type=int, default=3)\nargs = parser.parse_args()\n"
    "local_rank = int(os.environ['LOCAL_RANK'])\ndist.init_process_group('nccl')\n",
)
LocalRankArgument.INVALID = (
    Invalid.fixed_by(_parsing("'--local_rank', type=int, default=-1"), old="default=-1", new='default=int(os.environ.get("LOCAL_RANK", -1))'),
    Invalid(_parsing("'--local-rank', type=int"), line=6),
)
