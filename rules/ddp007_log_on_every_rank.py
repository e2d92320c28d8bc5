"""DDP007: prints, log records, TensorBoard writers and progress bars on every rank."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.every_rank_work import values_to_compute_first
from ddpify.anatomy.distributed.ranks import rank_guarded, runs_on_every_rank
from ddpify.anatomy.output import (
    LOG, PROCESS_ID, PROGRESS_BAR, RANK_ZERO_PRINT_SETUPS, WRITER, is_print, output_kind, rank_zero_object,
    sends_from_rank_zero_alone,
)
from ddpify.anatomy import syntax
from ddpify.anatomy.vocabulary import BUILTIN_PRINT, PRINT, is_pure_call
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import ACCELERATE_HEAD, ON_MAIN_PROCESS, guarded_case
from ddpify.rules._ddp import DDP_AND_ACCELERATE, call_arguments, per_rank_target, rank_zero_guard_fix

_LOGGING_SETUP = frozenset({"logging.basicConfig"})
_LOGGER_SETUP_METHODS = frozenset({"setLevel", "addHandler"})


class LogOnEveryRank(Rule, code="DDP007", name="log-on-every-rank", severity="warning"):
    """## What it does
    Flags `print(...)` (and a progress bar's `write`), `logging.info(...)`/`logger.info(...)` (debug/info levels),
    `SummaryWriter(...)`, `wandb.init(...)` and `tqdm(...)` without `disable=` that run on every
    rank. A `wandb.init(..., mode=None if rank == 0 else "disabled")` sends from rank 0 alone
    (wandb's disabled run, what `ddpify convert` starts). Output that names the rank
    (`print(f"[rank {rank}] ...")`) is per-rank on purpose; a
    logging setup whose level depends on the rank, or that runs on rank 0 only, already silences
    the other ranks; and a script that replaces `builtins.print` (the `setup_for_distributed`
    idiom) has its own rank-0 print. None of these is reported.

    Hugging Face Accelerate scripts are checked too: `accelerator.print(...)` prints on the main
    process only and is fine; a plain `print` (or `logging.info`, a `SummaryWriter`) is not.

    ## Why is this bad?
    Each line is printed world-size times, interleaved; progress bars overwrite each other; every
    rank's SummaryWriter writes its own event file into the same directory, so TensorBoard shows
    duplicated, conflicting curves (and `wandb.init` creates one run per rank). The values are
    usually rank 0's anyway (or only one shard's).

    ## Example
    ```python
    print(f"epoch {epoch} loss {loss.item():.4f}")
    ```

    ## Use instead
    ```python
    if rank == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")
    ```

    ## Fix safety
    A print or log statement is put under `if <rank-0 test>:`. The fix is safe when it reuses a
    rank-0 test that the same function already uses earlier, or an Accelerate script's
    `accelerator.is_main_process`; otherwise (a new `dist.get_rank() == 0`
    that needs an initialised process group at that point) it is unsafe. A call in the arguments
    that is not known to only format or read (an evaluation, a function of another file, a library
    call) is first computed on every rank into a fresh variable, left to right, as `ddpify convert`
    does (where it sits in `a if c else b`, an `and`/`or` or a comprehension, that whole part; a
    lambda, the call it is passed to); where the print itself consumes such a part there is no fix.
    Writers and progress bars have no fix: the object is used later on every rank.
    """

    message = "runs on every rank: the output is repeated world-size times"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        silenced = _logging_depends_on_rank(a)
        print_replaced = _replaces_builtin_print(a)
        for site in a.calls:
            call: ast.Call = site.node  # type: ignore[assignment]
            what = _output_kind(a, site, silenced)
            if what == PRINT and print_replaced:
                continue
            if what is None or per_rank_target(a, *call_arguments(call), through_variables=False) or _names_its_process(a, call):
                continue
            if not runs_on_every_rank(a, call):
                continue
            yield Finding(site.pos, f"{what} on every rank: the output is repeated world-size times", _fix(a, site, what))


def _output_kind(a, site, logging_silenced: bool) -> str | None:
    """What rank-0 output (ddpify.anatomy.output) the call makes that this rule reports: a print (a
    progress bar's write too), a log record, a writer built or a progress bar shown; a writer's and
    a wandb run's calls are reported where the writer is built, files written by DDP006."""
    call = site.node
    kind, keeper = output_kind(a, call), rank_zero_object(a, call)
    if is_print(kind):
        return PRINT
    if keeper == WRITER:
        return None if sends_from_rank_zero_alone(a, call) else site.qualname.rpartition(".")[2]
    if keeper == PROGRESS_BAR and syntax.keyword(call, "disable") is None:
        return PROGRESS_BAR
    return "log record" if kind == LOG and not logging_silenced else None


def _logging_depends_on_rank(a) -> bool:
    """Logging configured per rank: a level that depends on the rank, or handlers set up on some
    ranks only (the others keep the default WARNING level and drop info records)."""
    return any(
        (c.qualname in _LOGGING_SETUP or syntax.method_name(c.node) in _LOGGER_SETUP_METHODS)
        and (per_rank_target(a, *call_arguments(c.node)) or rank_guarded(a, c.node))
        for c in a.calls
    )


def _replaces_builtin_print(a) -> bool:
    """`builtins.print = rank_zero_print`: the DETR/DeiT `setup_for_distributed` idiom, here or in
    another module's helper the script calls (`utils.init_distributed_mode(args)`)."""
    return any(
        node.attr == PRINT and isinstance(node.ctx, ast.Store) and a.qualname(node) == BUILTIN_PRINT
        for node in a.nodes_of(ast.Attribute)
    ) or any(c.qualname.rpartition(".")[2] in RANK_ZERO_PRINT_SETUPS and a.callee(c.node) is None for c in a.calls)  # type: ignore[arg-type]


def _names_its_process(a, call: ast.Call) -> bool:
    """`print(f"[{os.getpid()}] ...")`: per-process output on purpose."""
    return any(isinstance(n, ast.Call) and a.qualname(n.func) == PROCESS_ID for n in ast.walk(call))


def _fix(a, site, what: str):
    stmt = site.stmt
    if what not in (PRINT, "log record") or not (isinstance(stmt, ast.Expr) and stmt.value is site.node):
        return None
    hoisted, blocked = values_to_compute_first(a, stmt)
    if blocked:
        return None  # under a rank test, work every rank must join would hang the others
    return rank_zero_guard_fix(a, stmt, may_be_safe=_only_pure_calls(a, site.node, hoisted), hoisted=hoisted)


def _only_pure_calls(a, call: ast.Call, hoisted) -> bool:
    """Does what stays under the rank test only format and read (the hoisted values run as before)?"""
    inner = [n for arg in (*call.args, *(k.value for k in call.keywords)) for n in ast.walk(arg) if isinstance(n, ast.Call)]
    return all(is_pure_call(a, n) or any(syntax.contains(h, lambda m, n=n: m is n) for h in hoisted) for n in inner)


_HEAD = """import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
loss = torch.ones(1)
"""
_EVALUATE = """
def evaluate(t):
    dist.all_reduce(t)
    return t.item()


"""
# a rank-0 test that the fix reuses
_STARTED = _HEAD + "if rank == 0:\n    print('start')\n"

LogOnEveryRank.VALID = (
    ACCELERATE_HEAD + "accelerator.print('epoch done')\n",
    ACCELERATE_HEAD + "from tqdm import tqdm\nfor i in tqdm(range(3), disable=not accelerator.is_local_main_process):\n    pass\n",
    _HEAD + "if rank == 0:\n    print(f'loss {loss.item():.4f}')\n",
    _HEAD + "print(f'[rank {rank}] ready')\n",
    _HEAD + "import logging\nlogging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)\nlogging.info('start')\n",
    _HEAD + "import logging\nlogger = logging.getLogger(__name__)\nlogger.warning('disk almost full')\n",
    _HEAD + "import logging\nif rank == 0:\n    logging.basicConfig(level=logging.INFO)\nlogging.info('start')\n",
    _HEAD + """import builtins


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        if is_master or kwargs.pop("force", False):
            builtin_print(*args, **kwargs)

    builtins.print = print


setup_for_distributed(rank == 0)
print("only rank 0 prints this")
""",
    # the same idiom in another module's helper (DeiT, MAE, DINO, DETR, ConvNeXt: utils.init_distributed_mode)
    _HEAD + "import utils\nutils.init_distributed_mode(args)\nprint('only rank 0 prints this')\n",
    # output that names its process is per-process on purpose
    _HEAD + "import os\nprint(f'[{os.getpid()}] joined the group')\n",
    # a rank-0 print helper that reads the launcher's RANK with a default (llm.c's print0)
    _HEAD + "import os\n\n\ndef print0(*args):\n    if int(os.environ.get('RANK', 0)) == 0:\n        print(*args)\n",
    _HEAD + "from tqdm import tqdm\nfor i in tqdm(range(3), disable=rank != 0):\n    pass\n",
    _HEAD + "from torch.utils.tensorboard import SummaryWriter\nwriter = SummaryWriter('runs/x') if rank == 0 else None\n",
    # every rank starts the wandb run, the others disabled
    _HEAD + "import wandb\nrun = wandb.init(project='p', mode=None if rank == 0 else 'disabled')\n",
    ACCELERATE_HEAD + f"import wandb\nwandb.init(project='p', mode=('offline') if {ON_MAIN_PROCESS} else 'disabled')\n",
    # an mp.spawn parent prints once, before the workers start
    """import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


if __name__ == "__main__":
    print("spawning 2 workers")
    mp.spawn(worker, args=(2,), nprocs=2)
""",
)
LogOnEveryRank.INVALID = (
    guarded_case(ACCELERATE_HEAD, "print('epoch done')\n", test=ON_MAIN_PROCESS),
    # the gather every process joins is computed first, on every process
    Invalid(
        ACCELERATE_HEAD + "print(accelerator.gather(torch.ones(1)).sum())\n",
        line=ACCELERATE_HEAD.count("\n") + 1,
        fixed=ACCELERATE_HEAD + f"gather_result = accelerator.gather(torch.ones(1))\nif {ON_MAIN_PROCESS}:\n    print(gather_result.sum())\n",
    ),
    guarded_case(_STARTED, "print(f'loss {loss.item():.4f}')\n"),
    guarded_case(_HEAD + "import logging\nlogger = logging.getLogger(__name__)\n", "logger.info('loss %f', loss.item())\n"),
    Invalid(_HEAD + "from torch.utils.tensorboard import SummaryWriter\nwriter = SummaryWriter('runs/exp')\n", line=8),
    Invalid(_HEAD + "import wandb\nwandb.init(project='p')\n", line=8),
    # an evaluation that every rank must join runs on every rank first, into a variable the print reads
    Invalid(
        _HEAD + _EVALUATE + "if rank == 0:\n    print('start')\nprint(f'acc {evaluate(loss):.4f}')\n",
        line=15,
        fixed=_HEAD + _EVALUATE + "if rank == 0:\n    print('start')\n"
        "evaluate_result = evaluate(loss)\nif rank == 0:\n    print(f'acc {evaluate_result:.4f}')\n",
    ),
    # a triple-quoted f-string keeps its contents: only the code lines move in
    Invalid(
        _STARTED + "print(f\"\"\"done\n  loss {loss.item():.4f}\n\"\"\")\n",
        line=9,
        fixed=_STARTED + "if rank == 0:\n    print(f\"\"\"done\n  loss {loss.item():.4f}\n\"\"\")\n",
    ),
    # an implicit concatenation over lines is re-indented with the call
    guarded_case(_STARTED, "print('loss',\n      'is',\n      loss.item())\n"),
    guarded_case(
        """import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
""",
        '    print("worker up")\n',
        after="""

if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
""",
    ),
)
