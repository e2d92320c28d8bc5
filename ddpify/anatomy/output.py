"""What a script outputs, and which of it rank 0 alone makes under DDP: the one judgement that the
rank-0 transform (codemods/ddp/rank_zero.py), the lint rules DDP006 and DDP007, the FSDP
transforms and `ddpify explain` all ask, so that convert guards exactly what lint reports.

Rank-0 output is a print (and a progress bar's `write`), a log record below WARNING (a warning or
an error tells what one rank saw: each rank keeps its own), a wandb call or a TensorBoard writer's,
a file written (`torch.save`, `np.save`, `pickle.dump`, `.savefig`, ...) and a file removed or moved
(`os.remove`, `shutil.rmtree`, `os.replace`, `path.unlink()`). Writers and progress
bars are objects rank 0 alone keeps (`rank_zero_object`): built on rank 0 only, or shown there. A
wandb run is the exception: every rank starts one, disabled off rank 0 (`disabled_off_rank_zero`),
since wandb's module state (`wandb.config`, `wandb.log`) is unusable where `wandb.init` never ran;
updating its config (`wandb.config.update(...)`) is state every rank reads, not output.
Accelerate's `accelerator.print` and `accelerator.save*` are output every rank may call: they are
made on the main process alone (`made_on_main_process`).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from ddpify.anatomy.syntax import keyword, method_name
from ddpify.anatomy import ROLE_LOGGER, ROLE_PBAR, ROLE_WRITER
from ddpify.anatomy.distributed.accelerate import accelerator_method
from ddpify.anatomy.distributed.ranks import is_rank_test
from ddpify.anatomy.vocabulary import (
    ACCELERATOR_OUTPUT,
    FILE_REMOVE_CALLS,
    FILE_REMOVE_METHODS,
    FILE_WRITE_CALLS,
    FILE_WRITE_METHODS,
    INFO_LOG_METHODS,
    LOG_METHODS,
    OPEN_CALLS,
    opens_for_writing,
    PRINT,
    TORCH_SAVE,
    TQDM_CONSTRUCTORS,
    TQDM_WRITE,
    WANDB,
    WANDB_CONFIG,
    WANDB_INIT,
    WANDB_MEDIA,
    WANDB_MODE,
    WRITER_CONSTRUCTORS,
)
from ddpify.anatomy.cache import per_anatomy

if TYPE_CHECKING:
    from ddpify.anatomy import Anatomy

# The kinds of rank-0 output (`output_kind`); a progress bar's class-level write is named by its
# qualname (`tqdm.tqdm.write`), and a bar's own `write` is a print.
LOG = "logging"
WANDB_CALL = "wandb"
WRITER_CALL = "tensorboard/wandb"
FILE_WRITTEN = "file written"
FILE_REMOVED = "file removed"  # or moved: every rank at once, all but the first find it gone
FILE_OUTPUT = frozenset({TORCH_SAVE, FILE_WRITTEN, FILE_REMOVED})  # the kinds that change files
# The kinds of objects rank 0 alone keeps (`rank_zero_object`).
WRITER = "writer"
PROGRESS_BAR = "progress bar"
# Other modules' helpers that replace `builtins.print` with a rank-0 print (the DETR/DeiT/MAE/DINO
# `init_distributed_mode(args)`, which calls `setup_for_distributed(args.rank == 0)`).
RANK_ZERO_PRINT_SETUPS = frozenset({"init_distributed_mode", "setup_for_distributed"})
PROCESS_ID = "os.getpid"  # output that names its process is per-process on purpose
MAIN_PROCESS_KEYWORD = "is_main_process"  # Hugging Face's save_pretrained(..., is_main_process=...) writes there only


def log_level(a: Anatomy, call: ast.AST) -> str | None:
    """The level of a log call (`logging.info(...)`, `logger.warning(...)`, `logging.getLogger().log(...)`)."""
    method = method_name(call)
    if method not in LOG_METHODS:
        return None
    func = call.func  # type: ignore[attr-defined]
    return method if (a.qualname(func) or "").startswith("logging.") or a.has_role(func.value, ROLE_LOGGER) else None


def output_kind(a: Anatomy, call: ast.AST) -> str | None:
    """Is `call` output that rank 0 alone makes under DDP, and which: PRINT, TORCH_SAVE, a
    `tqdm.write`'s qualname, FILE_WRITTEN, FILE_REMOVED, LOG, WANDB_CALL or WRITER_CALL; None when it is not (a
    warning or an error logged, a wandb.Image built, a wandb run started or its config updated, work)."""
    if not isinstance(call, ast.Call):
        return None
    q = a.qualname(call.func) or ""
    method = method_name(call)
    if q in (PRINT, TORCH_SAVE) or q.endswith(TQDM_WRITE):
        return q
    if q in FILE_WRITE_CALLS or method in FILE_WRITE_METHODS:
        return None if made_on_main_process(a, call) else FILE_WRITTEN
    if q in FILE_REMOVE_CALLS or method in FILE_REMOVE_METHODS:
        return FILE_REMOVED
    level = log_level(a, call)
    if level is not None:
        return LOG if level in INFO_LOG_METHODS else None
    if q.startswith(WANDB) and method not in WANDB_MEDIA and q != WANDB_INIT and not q.startswith(WANDB_CONFIG):
        return WANDB_CALL
    if method is None:
        return None
    if a.has_role(call.func.value, ROLE_WRITER):  # type: ignore[attr-defined]
        return WRITER_CALL
    return PRINT if method == "write" and a.has_role(call.func.value, ROLE_PBAR) else None  # type: ignore[attr-defined]


def is_print(kind: str | None) -> bool:
    """Is this output kind a print: `print(...)`, a progress bar's `write`?"""
    return kind is not None and (kind == PRINT or kind.endswith(TQDM_WRITE))


def rank_zero_object(a: Anatomy, call: ast.AST) -> str | None:
    """Does `call` build an object whose output rank 0 alone makes: WRITER (`SummaryWriter(...)`,
    `wandb.init(...)`) or PROGRESS_BAR (`tqdm(...)`)?"""
    q = a.qualname(call.func) if isinstance(call, ast.Call) else None
    if q in WRITER_CONSTRUCTORS:
        return WRITER
    return PROGRESS_BAR if q in TQDM_CONSTRUCTORS else None


def disabled_off_rank_zero(a: Anatomy, call: ast.AST) -> bool:
    """Is `call` a `wandb.init(...)`, which every rank runs, the ranks other than 0 with
    mode="disabled" (a run that sends nothing, whose calls and config still work)?"""
    return isinstance(call, ast.Call) and a.qualname(call.func) == WANDB_INIT


def sends_from_rank_zero_alone(a: Anatomy, call: ast.AST) -> bool:
    """`wandb.init(..., mode=None if RANK == 0 else "disabled")`: a run whose mode a rank test
    chooses (`accelerator.is_main_process` too), as `ddpify convert` starts it."""
    mode = keyword(call, WANDB_MODE) if disabled_off_rank_zero(a, call) else None
    return mode is not None and isinstance(mode.value, ast.IfExp) and is_rank_test(a, mode.value.test)


def made_on_main_process(a: Anatomy, call: ast.AST) -> bool:
    """Output that every rank may call, made on the main process alone: `accelerator.print(...)`,
    `accelerator.save(obj, path)`, `accelerator.save_model(model, dir)`, `accelerator.save_state(dir)`,
    and a Hugging Face `save_pretrained(dir, is_main_process=<rank-0 test>)`."""
    if accelerator_method(a, call) in ACCELERATOR_OUTPUT:
        return True
    told = keyword(call, MAIN_PROCESS_KEYWORD) if isinstance(call, ast.Call) else None
    return told is not None and is_rank_test(a, told.value)


def is_output_call(a: Anatomy, call: ast.Call) -> bool:
    """Output, not work: rank-0 output, output made on the main process alone, a log record at any
    level, a file opened (opened on every rank, a file for writing would be truncated by each)."""
    return (output_kind(a, call) is not None or made_on_main_process(a, call) or log_level(a, call) is not None
            or a.qualname(call.func) in OPEN_CALLS)


@per_anatomy
def output_statements(a: Anatomy) -> list[ast.stmt]:
    """The statements that are output: a print, log or save (`output_kind`), and `with open(..., "w")` blocks."""
    return [n for n in a.nodes_of(ast.Expr, ast.With, ast.AsyncWith)
            if (isinstance(n, ast.Expr) and output_kind(a, n.value)) or writes_file_in_block(a, n)]


def writes_file_in_block(a: Anatomy, stmt: ast.AST) -> bool:
    """`with open(path, "w") as f:`."""
    return isinstance(stmt, (ast.With, ast.AsyncWith)) and any(opens_for_writing(a, i.context_expr) for i in stmt.items)
