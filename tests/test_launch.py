"""`ddpify launch`: the printed commands, the sbatch script, and a real two-node run on one machine (which is also
the suite's real torchrun launch of a DDP conversion: its interpreters finalize as a user's do)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.commands.launch import node_commands, torchrun_argv
from ddpify.convert import convert_source
from test_teardown import PROBE, PROBED, TEARDOWN_ABORT

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MULTINODE = Path(__file__).resolve().parent / "data" / "multinode"
AGENT_TIMEOUT_S = 180


def launch(*args: str):
    return CliRunner().invoke(cli, ["launch", *args])


def test_one_node_is_standalone_and_passes_script_arguments():
    result = launch(str(FIXTURES / "expected/ddp/basic_main.py"), "--gpus-per-node", "4", "--", "--epochs", "3")
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("--standalone --nproc-per-node=4 " + str(FIXTURES / "expected/ddp/basic_main.py") + " --epochs 3")


def test_each_node_gets_its_rank_and_the_same_rendezvous():
    text = node_commands(["train.py"], 3, 8, "gpu-a", 29555, "job7")
    commands = [line for line in text.splitlines() if line.startswith("torchrun")]
    assert len(commands) == 3
    for rank, command in enumerate(commands):
        assert f"--node-rank={rank}" in command
        assert "--nnodes=3 " in command and "--nproc-per-node=8 " in command
        assert "--rdzv-backend=c10d --rdzv-endpoint=gpu-a:29555 --rdzv-id=job7 train.py" in command


def test_a_script_that_is_not_distributed_gets_a_hint_to_convert_it():
    result = launch(str(FIXTURES / "basic_main.py"))
    assert result.exit_code == 0
    assert "convert it first: ddpify convert" in result.output


def test_print_env_names_global_and_local_rank():
    result = launch(str(FIXTURES / "expected/ddp/basic_main.py"), "--nodes", "2", "--print-env")
    assert "RANK " in result.output and "LOCAL_RANK" in result.output and "NCCL_SOCKET_IFNAME" in result.output


def test_slurm_script_is_valid_bash_with_requeue_and_rendezvous_on_the_first_node(tmp_path):
    path = tmp_path / "job.sbatch"
    result = launch(str(FIXTURES / "expected/ddp/basic_main.py"), "--nodes", "2", "--gpus-per-node", "4",
                    "--slurm", str(path), "--partition", "gpu", "--", "--lr", "0.1")
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert os.access(path, os.X_OK)
    for expected in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=32",
                     "#SBATCH --partition=gpu", "#SBATCH --signal=B:USR1@120", "trap requeue USR1",
                     'scontrol show hostnames "$SLURM_JOB_NODELIST"', '--rdzv-endpoint="$head_node:$MASTER_PORT"',
                     "srun --kill-on-bad-exit=1 torchrun --nnodes=2 --nproc-per-node=4", "basic_main.py --lr 0.1"):
        assert expected in text
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


def _start_agent(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(agent: subprocess.Popen) -> tuple[int, str]:
    try:
        _, stderr = agent.communicate(timeout=AGENT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
        _, stderr = agent.communicate()
        pytest.fail(f"a torchrun agent hung for {AGENT_TIMEOUT_S} s:\n{stderr[-3000:]}")
    finally:
        try:
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return agent.returncode, stderr


def test_two_nodes_of_two_processes_train_one_model_log_once_download_per_node_and_end_cleanly(tmp_path):
    """Two torchrun agents rendezvous over c10d on 127.0.0.1, as the printed commands say.

    The test serves the rendezvous store itself, on a port it holds from the moment it is chosen (a
    port picked free and bound later by node 0's agent could be taken meanwhile by a test running
    beside this one); both agents then find it in use and join it as clients, as torchrun's c10d
    backend does when a store already listens at the endpoint.

    The script downloads its data (`download=True`) into the folder both nodes share (a shared filesystem):
    rank 0 fetches it once, and every other rank, local rank 0 of the second node too, finds it there.

    Its trainer, bound at module level, still holds the DDP wrapper at exit: tests/test_teardown.py's probe
    counts the wrappers still holding their all-reduces once the script is done (none may), and no rank may
    end in gloo's abort while its interpreter finalizes.
    """
    from ddpify.verify.rendezvous import HOST, serve_store  # imports torch

    work = tmp_path / "job"
    work.mkdir()
    shutil.copy(MULTINODE / "fakevision.py", work)
    script = work / "train_ddp.py"
    script.write_text(convert_source((MULTINODE / "train.py").read_text(), "ddp").output + PROBE)
    store = serve_store(4)
    endpoint = f"{HOST}:{store.port}"
    agents = []
    for node in range(2):
        argv = torchrun_argv([str(script)], 2, 2, endpoint, "ddpify-test", str(node))
        logs = tmp_path / f"logs{node}"
        argv = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(logs), "--redirects", "1", *argv[1:]]
        agents.append(_start_agent(argv, work))
    finished = [_finish(agent) for agent in agents]
    for node, (code, stderr) in enumerate(finished):
        assert code == 0 and TEARDOWN_ABORT not in stderr, f"node {node} failed:\n{stderr[-3000:]}"
        assert PROBED.findall(stderr) == ["0", "0"], f"node {node}:\n{stderr[-3000:]}"
    stdout = {(node, int(p.parent.name)): p.read_text()
              for node in range(2) for p in (tmp_path / f"logs{node}").glob("*/attempt_*/*/stdout.log")}
    assert sorted(stdout) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    logging_ranks = [key for key, text in stdout.items() if text.strip()]
    assert len(logging_ranks) == 1, f"ranks that printed: {logging_ranks}"
    steps = [line for line in stdout[logging_ranks[0]].splitlines() if line.startswith("epoch")]
    # 128 samples, batch 16, 4 ranks: 2 steps per epoch on each rank, 2 epochs
    assert len(steps) == 4, steps
    downloads = sorted(p.name for p in (work / "data").glob("downloaded-by-*"))
    assert len(downloads) == 1 and downloads[0].startswith("downloaded-by-local-rank-0-"), downloads
