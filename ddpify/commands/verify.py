"""`ddpify verify`: execute the original and the converted script side by side and compare them."""

from __future__ import annotations

import importlib.util
import json

import click

from ddpify.commands import EXIT_ERROR
from ddpify.verify.report import render
from ddpify.verify.result import exit_code
from ddpify.verify.runner import Request, verify as verify_pair


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.option("--to", "target", type=click.Choice(["ddp", "dp", "fsdp"]), required=True,
              help="What the candidate is: DDP (N ranks, torchrun-style) or DataParallel (one process).")
@click.option("--against", type=click.Path(exists=True, dir_okay=False),
              help="Check this multi-GPU script (e.g. a hand-written port) instead of converting SCRIPT.")
@click.option("--nproc", type=click.IntRange(min=1), default=2, show_default=True, help="DDP ranks to run.")
@click.option("--steps", type=click.IntRange(min=1), default=8, show_default=True,
              help="Optimizer steps to record and compare.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--batch-size", "batch_mode", type=click.Choice(["per-gpu", "global"]), default="per-gpu",
              show_default=True, help="Whether the candidate keeps the per-GPU batch or splits the global one.")
@click.option("--timeout", type=click.FloatRange(min=1), default=60, show_default=True,
              help="Seconds before a still-running process counts as hung.")
@click.option("--launcher", type=click.Choice(["fork", "torchrun"]), default="fork", show_default=True,
              help="fork: one process imports torch and forks every run; torchrun: the candidate runs under "
                   "real `torchrun --standalone`.")
@click.option("--mixed-precision", type=click.Choice(["keep", "policy"]), default="keep", show_default=True,
              help="--to fsdp: convert with this --mixed-precision (policy: bf16/fp16 parameters where the script "
                   "autocasts; the runs are then compared in statistical mode).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--keep", is_flag=True, help="Keep the run directories and logs (they are removed unless a run fails).")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def verify(ctx: click.Context, script: str, target: str, against: str | None, nproc: int, steps: int, device: str,
           batch_mode: str, timeout: float, launcher: str, mixed_precision: str, as_json: bool, keep: bool,
           script_args: tuple[str, ...]) -> None:
    """EXECUTE SCRIPT and its multi-GPU version and check that they train the same.

    Unlike ddpify's other commands, which only read code, verify RUNS your scripts:
    the original as one process and the candidate (SCRIPT converted by ddpify, or the
    --against file) as N DDP ranks or one DataParallel process, with the arguments after
    `--`. Only run scripts you trust. Each side runs in a private copy of the current
    directory (small files copied, large ones linked), so relative data files are found
    and nothing the scripts write lands in your tree; `sys.argv[0]` is the path you typed.
    The scripts see your environment plus OMP_NUM_THREADS=1, MKL_NUM_THREADS=1,
    PYTHONHASHSEED=0, CUBLAS_WORKSPACE_CONFIG=:4096:8 (and CUDA_VISIBLE_DEVICES='' for
    --device cpu); the candidate's ranks also get RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT.

    Both runs are deterministic, with dropout switched off; the single-process run's
    batches are re-cut so that each of its steps sees exactly what the N ranks see
    together. verify then compares the loss and parameters after every optimizer step.

    Exit status: 0 equivalent, 1 diverged (the first step is named), 2 could not run.
    """
    if not _torch_installed():
        click.echo('error: ddpify verify runs your scripts and needs torch, which is not installed: pip install "ddpify[verify]"', err=True)
        ctx.exit(EXIT_ERROR)
    if mixed_precision != "keep" and (target != "fsdp" or against):
        raise click.UsageError("--mixed-precision applies to --to fsdp when ddpify converts the script (not with --against)")
    request = Request(script, target, against, nproc, steps, device, batch_mode, timeout, launcher, script_args, keep, mixed_precision)
    result = verify_pair(request)
    click.echo(json.dumps(result, indent=1) if as_json else render(request, result))
    ctx.exit(exit_code(result))


def _torch_installed() -> bool:
    """Can torch be imported here? (Checked without importing it: that takes seconds.)"""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


COMMANDS = (verify,)
