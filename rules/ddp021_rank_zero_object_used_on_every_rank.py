"""DDP021: an object only rank 0 builds (None on the others) that every rank goes on to use."""

from __future__ import annotations

import ast

from ddpify.anatomy import syntax
from ddpify.anatomy.distributed.ranks import conditions_on, is_rank_test, rank_guarded
from ddpify.anatomy.distributed.reaching import assignments, reaching_values
from ddpify.edits.statements import guard
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import statement_edit
from ddpify.rules._cases import ACCELERATE_HEAD, ON_MAIN_PROCESS
from ddpify.rules._ddp import DDP_AND_ACCELERATE

_MAX_DEPTH = 4


class RankZeroObjectUsedOnEveryRank(Rule, code="DDP021", name="rank-zero-object-used-on-every-rank", severity="error"):
    """## What it does
    Flags the use of an object that only rank 0 builds, where the other ranks hold None
    (`writer = SummaryWriter() if rank == 0 else None`, `run = None` then `if rank == 0: run =
    wandb.init()`): a method call (`writer.add_scalar(...)`) or an attribute read
    (`os.path.join(writer.log_dir, "ckpt.pt")`) that runs on every rank, without a rank test or a
    `writer is not None` check around it. The object is followed into the functions it is passed
    to and onto `self`. Hugging Face Accelerate scripts are checked too (`SummaryWriter() if
    accelerator.is_main_process else None`).

    ## Why is this bad?
    On every rank but 0 the name holds None, so the call raises `AttributeError: 'NoneType' object
    has no attribute 'add_scalar'`. That rank dies, and rank 0 waits at its next collective for a
    rank that is gone until the timeout kills the job. An attribute that feeds a path every rank
    needs (a log directory for checkpoints) has no value there at all.

    ## Example
    ```python
    writer = SummaryWriter() if rank == 0 else None
    for step, (x, y) in enumerate(loader):
        ...
        writer.add_scalar("loss", loss.item(), step)
    ```

    ## Use instead
    ```python
    writer = SummaryWriter() if rank == 0 else None
    for step, (x, y) in enumerate(loader):
        ...
        if writer is not None:
            writer.add_scalar("loss", loss.item(), step)
    ```
    and share what every rank reads (`log_dir = writer.log_dir if rank == 0 else None`, then
    `dist.broadcast_object_list`), or give the other ranks an object whose methods do nothing
    (what `ddpify convert` does for a SummaryWriter). A wandb run is best started on every rank,
    disabled off rank 0 (`wandb.init(..., mode=None if rank == 0 else "disabled")`, what `ddpify
    convert` does): its config, log and finish work everywhere, and rank 0 alone sends.

    ## Fix safety
    A statement that only calls a method of the object is put under `if <name> is not None:`:
    safe, rank 0 runs it as before and the other ranks skip it. An attribute read has no fix: the
    other ranks need its value, which only rank 0 has.
    """

    message = "the object is None on ranks other than 0, which use it: AttributeError there, and the job hangs"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        for node in a.nodes_of(ast.Attribute):
            if not isinstance(node.ctx, ast.Load):
                continue
            holder = node.value
            if not _none_elsewhere(a, holder) or rank_guarded(a, node) or _checked(a, holder, node):
                continue
            name = ast.unparse(holder)
            yield Finding(a.pos(node), f"`{name}` is None on ranks other than 0 (only rank 0 builds it), so "
                                       f"`{ast.unparse(node)}` raises AttributeError there and the job hangs",
                          _guard_fix(a, node, name))


def _none_elsewhere(a, expr: ast.AST, depth: int = 0) -> bool:
    """Does `expr` hold None on the ranks that skip building it: `X if rank == 0 else None`, or a
    variable set to None and assigned under a rank test (followed into parameters and `self`)?"""
    if isinstance(expr, ast.IfExp):
        return is_rank_test(a, expr.test) and (syntax.constant(expr.body, None) or syntax.constant(expr.orelse, None))
    if depth > _MAX_DEPTH or not isinstance(expr, (ast.Name, ast.Attribute)):
        return False
    entries = assignments(a).get(a.ref(expr), []) if a.ref(expr) else []
    if any(syntax.constant(v, None) for _, v in entries) and any(rank_guarded(a, s) for s, _ in entries):
        return True
    return any(_none_elsewhere(a, v, depth + 1) for v in reaching_values(a, expr))


def _checked(a, holder: ast.AST, use: ast.AST) -> bool:
    """Is `use` behind a test that reads the object itself (`if writer is not None:`, `if writer:`)?"""
    ref = a.ref(holder)
    return any(a.ref(n) == ref for test in conditions_on(a, use) for n in ast.walk(test)
               if isinstance(n, (ast.Name, ast.Attribute)))


def _guard_fix(a, node: ast.Attribute, name: str) -> Fix | None:
    """`writer.add_scalar(...)` alone in its statement -> under `if writer is not None:`."""
    stmt = a.stmt_of.get(node)
    call = a.parents.get(node)
    if not (isinstance(stmt, ast.Expr) and stmt.value is call and isinstance(call, ast.Call) and call.func is node):
        return None
    edit = statement_edit(a, stmt, lambda s: [guard([s], f"{name} is not None")])
    return Fix((edit,), safe=True, description=f"call it only where `{name}` was built") if edit else None


_HEAD = """import os
import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

dist.init_process_group("gloo")
rank = dist.get_rank()
"""

RankZeroObjectUsedOnEveryRank.VALID = (
    _HEAD + "writer = SummaryWriter() if rank == 0 else None\nif rank == 0:\n    writer.add_scalar('loss', 1.0, 0)\n",
    _HEAD + "writer = SummaryWriter() if rank == 0 else None\nif writer is not None:\n    writer.add_scalar('loss', 1.0, 0)\n",
    _HEAD + "writer = SummaryWriter() if rank == 0 else None\nwriter and writer.flush()\n",
    # every rank builds it
    _HEAD + "writer = SummaryWriter(f'runs/rank{rank}')\nwriter.add_scalar('loss', 1.0, 0)\n",
)
RankZeroObjectUsedOnEveryRank.INVALID = (
    # Accelerate: the writer of the main process only
    Invalid(ACCELERATE_HEAD + "from torch.utils.tensorboard import SummaryWriter\n"
            f"writer = SummaryWriter() if {ON_MAIN_PROCESS} else None\nwriter.add_scalar('loss', 1.0, 0)\n",
            line=ACCELERATE_HEAD.count("\n") + 3),
    Invalid(_HEAD + "writer = SummaryWriter() if rank == 0 else None\nwriter.add_scalar('loss', 1.0, 0)\n", line=9,
            fixed=_HEAD + "writer = SummaryWriter() if rank == 0 else None\nif writer is not None:\n    writer.add_scalar('loss', 1.0, 0)\n"),
    Invalid(_HEAD + "writer = SummaryWriter() if rank == 0 else None\nckpt = os.path.join(writer.log_dir, 'model.pt')\n", line=9),
    Invalid(_HEAD + """run = None
if rank == 0:
    run = SummaryWriter()


def save(model, writer):
    torch.save(model.state_dict(), os.path.join(writer.log_dir, "m.pt"))


save(torch.nn.Linear(1, 1), run)
""", line=14),
    Invalid(_HEAD + """class Trainer:
    def __init__(self):
        self.writer = SummaryWriter() if rank == 0 else None

    def log(self, loss):
        self.writer.add_scalar("loss", loss, 0)
""", line=13),
)
