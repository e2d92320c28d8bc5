"""`ddpify launch SCRIPT`: print how to start a converted script on one or many nodes.

Nothing is run or submitted: the torchrun command for each node, an sbatch script with
`--slurm`, and the environment worth checking with `--print-env` are plain text to review.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from ddpify.exit_codes import EXIT_ERROR, EXIT_OK
from ddpify.sources import SourceError, read_source, write_atomic

DEFAULT_PORT = 29500

# What torchrun sets in every process it starts (the converted script reads the first three).
TORCHRUN_ENV = (
    ("RANK", "global rank: 0 on exactly one process of the whole job (logs, checkpoints, metrics)"),
    ("LOCAL_RANK", "rank on this node: picks the GPU, and 0 once per node (downloads, node-local caches)"),
    ("WORLD_SIZE", "processes in the whole job: nodes x GPUs per node"),
    ("LOCAL_WORLD_SIZE", "processes on this node"),
    ("GROUP_RANK", "this node's rank among the nodes"),
    ("MASTER_ADDR, MASTER_PORT", "the rendezvous host and port, as torchrun resolved them"),
)

# What a user sets (or checks) before a multi-node run goes wrong.
USER_ENV = (
    ("NCCL_DEBUG=INFO", "NCCL prints the network interfaces and transports it picked"),
    ("NCCL_SOCKET_IFNAME=<iface>", "the interface the nodes reach each other on (e.g. eth0, ib0)"),
    ("GLOO_SOCKET_IFNAME=<iface>", "the same for gloo (CPU tensors, the rendezvous store)"),
    ("OMP_NUM_THREADS=<cores per GPU>", "torchrun sets 1 by default; raise it for CPU-heavy data loading"),
    ("CUDA_VISIBLE_DEVICES", "leave unset: torchrun's LOCAL_RANK indexes the visible GPUs"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "a rank that dies takes the job down instead of hanging it"),
)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Machines in the job.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=1, show_default=True, help="Processes (GPUs) per machine.")
@click.option("--host", default="<node0-host>", show_default=True, help="Host of the first node (the rendezvous endpoint).")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True, help="Rendezvous port on the first node.")
@click.option("--job-id", default="ddpify-job", show_default=True, help="Rendezvous id shared by every node of one job.")
@click.option("--slurm", "slurm_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write an sbatch script here (srun + torchrun, rendezvous on the first node).")
@click.option("--cpus-per-task", type=click.IntRange(min=1), default=None, help="sbatch --cpus-per-task (default: 8 per GPU).")
@click.option("--time", "time_limit", default="04:00:00", show_default=True, help="sbatch --time.")
@click.option("--partition", default=None, help="sbatch --partition.")
@click.option("--print-env", is_flag=True, help="Also print the environment torchrun sets and the variables worth checking.")
def launch(script, script_args, nodes, gpus_per_node, host, port, job_id, slurm_path, cpus_per_task, time_limit, partition, print_env):
    """Print the torchrun command(s) that start SCRIPT on NODES x GPUS-PER-NODE processes.

    Nothing is run or submitted. Arguments after SCRIPT are passed to it.
    Exit codes: 0 printed (or written), 2 bad input.
    """
    warning = _not_distributed_warning(script)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    command = [str(script), *script_args]
    if slurm_path is not None:
        text = sbatch_script(command, nodes, gpus_per_node, port, cpus_per_task or 8 * gpus_per_node, time_limit, partition)
        try:
            write_atomic(slurm_path, text.encode("utf-8"), 0o755)
        except SourceError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_ERROR)
        click.echo(f"wrote {slurm_path}; submit it with: sbatch {shlex.quote(str(slurm_path))}")
    else:
        click.echo(node_commands(command, nodes, gpus_per_node, host, port, job_id), nl=False)
    if print_env:
        click.echo(environment_checklist(), nl=False)
    sys.exit(EXIT_OK)


def torchrun_argv(command: list[str], nodes: int, gpus_per_node: int, endpoint: str, job_id: str, node_rank: str | None) -> list[str]:
    """torchrun's arguments for one node (a single node needs no rendezvous host)."""
    if nodes == 1:
        return ["torchrun", "--standalone", f"--nproc-per-node={gpus_per_node}", *command]
    rank = [f"--node-rank={node_rank}"] if node_rank is not None else []
    return ["torchrun", f"--nnodes={nodes}", *rank, f"--nproc-per-node={gpus_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job_id}", *command]


def node_commands(command: list[str], nodes: int, gpus_per_node: int, host: str, port: int, job_id: str) -> str:
    """One shell line per node, each under a comment naming the node."""
    if nodes == 1:
        return _shell(torchrun_argv(command, 1, gpus_per_node, "", job_id, None)) + "\n"
    lines = []
    for node in range(nodes):
        where = f"on {host} (node 0, the rendezvous host)" if node == 0 else f"on node {node}"
        lines.append(f"# {where}:")
        lines.append(_shell(torchrun_argv(command, nodes, gpus_per_node, f"{host}:{port}", job_id, str(node))))
    return "\n".join(lines) + "\n"


def sbatch_script(command: list[str], nodes: int, gpus_per_node: int, port: int, cpus_per_task: int, time_limit: str, partition: str | None) -> str:
    """A reviewable sbatch script: one srun task per node, each running torchrun for its GPUs.

    Slurm signals the batch shell (USR1) two minutes before the time limit; the trap requeues
    the job, which restarts from the script's own checkpoints.
    """
    argv = torchrun_argv(command, nodes, gpus_per_node, '"$head_node:$MASTER_PORT"', '"$SLURM_JOB_ID"', None)
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={Path(command[0]).stem}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        f"#SBATCH --cpus-per-task={cpus_per_task}",
        f"#SBATCH --time={time_limit}",
        "#SBATCH --signal=B:USR1@120",
        "#SBATCH --requeue",
        "#SBATCH --output=%x-%j.out",
    ]
    if partition:
        header.append(f"#SBATCH --partition={partition}")
    body = f"""
# Written by `ddpify launch`; nothing was submitted. Review, then: sbatch <this file>
set -euo pipefail

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT={port}
export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / {gpus_per_node} > 0 ? SLURM_CPUS_PER_TASK / {gpus_per_node} : 1 ))

# Requeue on the time-limit warning: the job restarts and resumes from its checkpoints.
requeue() {{
    echo "time limit near: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
}}
trap requeue USR1

# One task per node; torchrun starts {gpus_per_node} process(es) per node and they meet on the first node.
srun --kill-on-bad-exit=1 {" ".join(_quote_keeping_vars(a) for a in argv)} &
wait
"""
    return "\n".join(header) + "\n" + body


def environment_checklist() -> str:
    """The variables torchrun sets, and those a user should check for a multi-node run."""
    lines = ["", "# torchrun sets, in every process:"]
    lines += [f"#   {name:<26} {meaning}" for name, meaning in TORCHRUN_ENV]
    lines += ["# worth checking before a multi-node run:"]
    lines += [f"#   {name:<34} {meaning}" for name, meaning in USER_ENV]
    return "\n".join(lines) + "\n"


def _not_distributed_warning(script: Path) -> str:
    """A hint when SCRIPT does not join a process group (not converted yet), or cannot be read."""
    from ddpify.anatomy import analyze

    try:
        kind = analyze(read_source(script).text, str(script)).kind
    except SourceError as error:
        return f"{error}; the command is printed all the same"
    except (SyntaxError, ValueError):
        return f"{script}: not valid Python; the command is printed all the same"
    if kind.distributed:
        return ""
    return f"{script} does not join a process group; convert it first: ddpify convert {script} --to ddp"


def _shell(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _quote_keeping_vars(arg: str) -> str:
    """Shell-quote an argument unless it already carries its own quoting for a $VARIABLE."""
    return arg if '"$' in arg else shlex.quote(arg)


COMMANDS = (launch,)
