"""`ddpify verify`: execute the original and the converted script side by side and compare them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import click

from ddpify.exit_codes import EXIT_ERROR
from ddpify.verify.plot import plot_problem, write_plot
from ddpify.verify.project_root import given_root
from ddpify.verify.report import header, render
from ddpify.verify.result import exit_code
from ddpify.verify.runner import Request, verify as verify_pair


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.option("--to", "target", type=click.Choice(["ddp", "dp", "fsdp", "accelerate"]), required=True,
              help="What the candidate is: DDP (N ranks, torchrun-style) or DataParallel (one process).")
@click.option("--against", type=click.Path(exists=True, dir_okay=False),
              help="Check this multi-GPU script (e.g. a hand-written port) instead of converting SCRIPT.")
@click.option("--nproc", type=click.IntRange(min=1), default=2, show_default=True,
              help="DDP/FSDP ranks to run; for dp, the DataParallel replicas simulated on fewer than 2 GPUs.")
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
@click.option("--root", type=click.Path(exists=True, file_okay=False),
              help="Mirror this folder (it must hold the current directory) for each side, not the one verify finds: "
                   "the current directory, or the project root above it that the script's relative paths reach.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--keep", is_flag=True, help="Keep the run directories and logs (they are removed unless a run fails).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also draw the loss and the parameter error per step into this image (png, svg, pdf; "
                   'needs matplotlib: pip install "ddpify[plot]").')
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def verify(ctx: click.Context, script: str, target: str, against: str | None, nproc: int, steps: int, device: str,
           batch_mode: str, timeout: float, launcher: str, mixed_precision: str, root: str | None, as_json: bool, keep: bool,
           plot_path: str | None, script_args: tuple[str, ...]) -> None:
    """EXECUTE SCRIPT and its multi-GPU version and check that they train the same.

    Unlike ddpify's other commands, which only read code, verify RUNS your scripts:
    the original as one process and the candidate (SCRIPT converted by ddpify, or the
    --against file) as N DDP ranks or one DataParallel process, with the arguments after
    `--`. Only run scripts you trust. Each side runs in a private copy of the current
    directory (small files copied, large ones linked), so relative data files are found
    and nothing the scripts write lands in your tree; `sys.argv[0]` is the path you typed.
    Where the script's relative paths (`../data`), the arguments after `--`, relative
    PYTHONPATH entries (`..`) or its `sys.path` edits reach above the current directory, the
    copy is of the folder they reach (--root names it instead), and each side runs in its
    copy of the current directory; PYTHONPATH entries inside that folder lead into the copy.
    The scripts see your environment plus OMP_NUM_THREADS=1, MKL_NUM_THREADS=1,
    PYTHONHASHSEED=0, CUBLAS_WORKSPACE_CONFIG=:4096:8 (and CUDA_VISIBLE_DEVICES='' for
    --device cpu); the candidate's ranks also get what torchrun sets: RANK, LOCAL_RANK,
    WORLD_SIZE, GROUP_RANK, ROLE_*, TORCHELASTIC_*, MASTER_ADDR, MASTER_PORT and
    TORCHELASTIC_USE_AGENT_STORE=True (the launcher serves the rendezvous store, on a port
    the OS picks as it binds).

    With fewer than 2 GPUs (always with --device cpu), a dp candidate's DataParallel runs as
    --nproc simulated replicas in its one process (scatter along dim 0, replicas, gather), so
    what DataParallel changes on GPUs is checked, and the report says so.

    Both runs are deterministic, with dropout switched off; the single-process run's
    batches are re-cut so that each of its steps sees exactly what the N ranks see
    together. verify then compares the loss and parameters after every optimizer step.

    --plot out.png draws the reference's and the candidate's loss per step over the parameter
    error per step (the table's Δparam/update and max rel Δparam, with their tolerances);
    --json carries the same per-step figures.

    A candidate that never runs a forward through its DataParallel, DDP or FSDP wrapper is "not
    converted", whatever its steps show, unless the converter averaged its gradients by hand (a
    model that builds and steps its own optimizer). A run that fails is named by its traceback's
    exception line; a run still going at --timeout by each rank's stack: the script's line, the
    call it waits in, and the converter's change that wrote that line.

    Exit status: 0 equivalent, 1 diverged (the first step is named), 2 could not run, 3 not converted.
    """
    if not _torch_installed():
        click.echo('error: ddpify verify runs your scripts and needs torch, which is not installed: pip install "ddpify[verify]"', err=True)
        ctx.exit(EXIT_ERROR)
    problem = plot_problem(plot_path) if plot_path else None
    if problem:
        click.echo(f"error: {problem}", err=True)
        ctx.exit(EXIT_ERROR)
    if mixed_precision != "keep" and (target != "fsdp" or against):
        raise click.UsageError("--mixed-precision applies to --to fsdp when ddpify converts the script (not with --against)")
    if root:
        try:
            given_root(root, Path.cwd())
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--root") from error
    request = Request(script, target, against, nproc, steps, device, batch_mode, timeout, launcher, script_args, keep, mixed_precision, root)
    result = verify_pair(request)
    click.echo(json.dumps(result, indent=1) if as_json else render(request, result))
    if plot_path:
        _plot(result, plot_path, header(request))
    ctx.exit(exit_code(result))


def _plot(result: dict, path: str, title: str) -> None:
    """Write the plot, or say on stderr why there is none (no step was compared)."""
    if not result["steps"]:
        click.echo(f"no plot written to {path}: no step was compared", err=True)
        return
    write_plot(result, path, title)
    click.echo(f"plot written to {path}", err=True)


def _torch_installed() -> bool:
    """Can torch be imported here? (Checked without importing it: that takes seconds.)"""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


COMMANDS = (verify,)
