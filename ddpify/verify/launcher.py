"""Start the reference and the candidate ranks, wait for them, and judge the pair.

`python -m ddpify.verify.launcher`, started by the command in a process group of its
own as early as possible: it imports torch while the command converts the script, then
reads the plan's path from stdin. torch is imported here once; the reference and every candidate
rank are then os.fork()ed from this process (torch's thread pools have not started:
no tensor math happens before the forks), each sets its torchrun-style environment
and runs its script through the harness. The forked ranks rendezvous on a TCPStore this
process serves (see rendezvous.py; its server thread is the one thread running when they
are forked, and they only talk to it over TCP). With `launcher == "torchrun"` the candidate
runs under real `torchrun --standalone` instead, whose agent serves the store the same way.
A DataParallel candidate is one process; with fewer than two GPUs visible here, its
DataParallel runs as simulated replicas (see dataparallel.py), and the verdict says so.

A rank that fails cuts the wait short; a run still going after the plan's timeout
is reported as hung, at the place its faulthandler dump (taken at the deadline, before
anything is killed) shows, with the converter's change that wrote that line. The verdict goes to
result.json; the command then kills whatever is left in the process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

from ddpify.collector import FEWER_COLLECTIONS

# Imported once here and shared by every forked run: what DDP scripts load, and
# torch._dynamo, which every optimizer's construction imports (seconds of CPU each).
# The forks come later, at the thresholds this process started with.
with FEWER_COLLECTIONS:
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

from ddpify.verify import harness
from ddpify.verify.alignment import RECUT_FLAG
from ddpify.verify.compare import Record, judge
from ddpify.verify.dataparallel import failure_hint
from ddpify.verify.diagnose import SLOW_START, Stuck, exception_line_in, fatal_error_in, raise_location, stuck_in
from ddpify.verify.plan import CANDIDATE, REFERENCE, Plan
from ddpify.verify.rendezvous import AGENT_STORE_VARIABLE, client_environment, serve_store
from ddpify.verify.result import error_result

HANG_DUMP_GRACE_S = 1.0
FAILURE_GRACE_S = 2.0
POLL_S = 0.02
# What torchrun sets in each worker's environment (torch 2.x, one node), but TORCHELASTIC_ERROR_FILE,
# the file of its own @record decorator: the rank's own variables, then its agent's.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "ROLE_RANK")
AGENT_VARIABLES = {"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": "0",
                   "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                   "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}
WORLD_VARIABLES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE")
DISTRIBUTED_VARIABLES = (*RANK_VARIABLES, *WORLD_VARIABLES, *AGENT_VARIABLES, "MASTER_ADDR", "MASTER_PORT", AGENT_STORE_VARIABLE)


class ForkedRun:
    """A child made with os.fork, polled like a Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def rank_environment(rank: int, world: int, store: torch.distributed.TCPStore) -> dict[str, str]:
    """What torchrun sets for one rank on a single node, its agent serving `store`."""
    return {**dict.fromkeys(RANK_VARIABLES, str(rank)), **dict.fromkeys(WORLD_VARIABLES, str(world)), **AGENT_VARIABLES,
            **client_environment(store)}


def fork_role(plan: Plan, role: str, environment: dict[str, str]) -> ForkedRun:
    """Fork a child that runs `role` under the harness with `environment` (and no other rank variables)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedRun(pid)
    try:
        for name in DISTRIBUTED_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(environment)
        harness.run_role(plan, role)
    finally:
        os._exit(70)


def start_torchrun(plan: Plan, plan_path: str) -> subprocess.Popen:
    """The candidate under real torchrun; its workers run `python -m ddpify.verify.harness`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={plan.nproc}",
               "--module", "ddpify.verify.harness", plan_path, CANDIDATE]
    with open(os.path.join(plan.outdir, "torchrun.txt"), "w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=plan.candidate.workdir)


def start_runs(plan: Plan, plan_path: str) -> tuple[list, torch.distributed.TCPStore | None]:
    """The reference, then the candidate: one process per rank (one in all for dp) or one torchrun;
    and the store that forked ranks rendezvous on, to keep while they run."""
    runs = [fork_role(plan, REFERENCE, {})]
    if plan.target == "dp":
        return runs + [fork_role(plan, CANDIDATE, {})], None
    if plan.launcher == "torchrun":
        return runs + [start_torchrun(plan, plan_path)], None
    store = serve_store(plan.nproc)
    ranks = [fork_role(plan, CANDIDATE, rank_environment(rank, plan.nproc, store)) for rank in range(plan.nproc)]
    return runs + ranks, store


def wait_for(runs: list, deadline: float) -> None:
    """Until every run ends, a failure's grace period passes, or the deadline (plus time to dump stacks)."""
    deadline += HANG_DUMP_GRACE_S
    while True:
        codes = [run.poll() for run in runs]
        if None not in codes:
            return
        if any(code for code in codes if code is not None):
            deadline = min(deadline, time.time() + FAILURE_GRACE_S)
        if time.time() > deadline:
            return
        time.sleep(POLL_S)


def processes(plan: Plan) -> list[tuple[str, int, str]]:
    """(role, rank, label) of every process the plan runs."""
    label = "rank {}" if plan.distributed else "candidate"
    return [(REFERENCE, 0, "reference")] + [(CANDIDATE, r, label.format(r)) for r in range(plan.candidate.ranks)]


def signalled(plan: Plan, runs: list) -> dict[tuple[str, int], int]:
    """(role, rank) -> the signal that ended it, for each forked process a signal ended (a C++ abort:
    gloo's on a collective mismatch); torchrun's workers are its agent's to watch."""
    forked = [run for run in runs if isinstance(run, ForkedRun)]
    return {(role, rank): -run.returncode for (role, rank, _), run in zip(processes(plan), forked)
            if run.returncode is not None and run.returncode < 0}


def failure_message(plan: Plan, killed: dict[tuple[str, int], int]) -> tuple[str | None, list[dict]]:
    """Why the pair could not run (the reference's failure, else the candidates' first: a traceback, or a
    death by a signal from the `killed`, with its log's last words; else every process that never finished),
    or None; and where each hung process sat (see hang_report). The reference runs apart from the ranks: its
    failure is the original script's own, whichever process happened to fail first."""
    failures = []
    silent, hangs = [], []
    for role, rank, label in processes(plan):
        error = plan.file("error", role, rank)
        if os.path.exists(error):
            hint = failure_hint(exception_line_in(error)) if plan.dp_simulated and role == CANDIDATE else None
            because = f" ({hint})" if hint else ""
            failures.append(((role != REFERENCE, os.path.getmtime(error)), f"{label} failed: {exception_line_in(error)}{because}"))
        elif not os.path.exists(stack := plan.file("stack", role, rank)):  # opened before the script starts
            silent.append(f"{label} had not started the script {plan.timeout:g} s after launch {SLOW_START}")
        elif (role, rank) in killed or fatal_error_in(stack):  # its log and dump were last written as it died
            failures.append(((role != REFERENCE, os.path.getmtime(stack)), death(plan, role, rank, label, killed.get((role, rank)))))
        elif not os.path.exists(plan.file("record", role, rank)):
            stuck = stuck_in(stack, (plan.run(role).import_dir, plan.run(role).workdir))
            if stuck and stuck.importing:
                silent.append(still_importing(label, stuck, plan.timeout))
            elif stuck:
                hangs.append(hang_report(plan, label, stuck))
                silent.append(f"{label} hung for {plan.timeout:g} s {hangs[-1]['summary']}")
            else:
                silent.append(f"{label} ended without a record (killed, or it called os._exit)")
    if failures:
        return recut_failure(plan) or min(failures)[1], []
    return "; ".join(silent) or None, hangs


def still_importing(label: str, stuck: Stuck, timeout: float) -> str:
    """A process that was loading a library at the deadline: one starting slowly, not one that hung."""
    where = f"for {stuck.script[0]}" if stuck.script else "deeper than its stack dump reaches"
    return f"{label} was still importing {stuck.importing} {timeout:g} s after launch, {where} {SLOW_START}"


def death(plan: Plan, role: str, rank: int, label: str, signal_number: int | None) -> str:
    """A process a signal ended: what of (the signal, or faulthandler's word for it), where its dump
    shows it was, and the last words of its log (a C++ abort's `what(): ...`)."""
    stack, log = plan.file("stack", role, rank), plan.file("log", role, rank)
    cause = signal.Signals(signal_number).name if signal_number else fatal_error_in(stack)
    stuck = stuck_in(stack, (plan.run(role).import_dir, plan.run(role).workdir))
    where = f" {stuck}" if stuck and stuck.script else ""
    return f"{label} died of {cause}{where}: {exception_line_in(log)}"


def hang_report(plan: Plan, label: str, stuck: Stuck) -> dict:
    """A hung process: one line (where it sat, the call it waits in, and the converter's change that put
    that line there, when its report names one), and its stack reduced to that call and the script's
    frames, innermost first."""
    change = plan.change_at(stuck.script[0].file, stuck.script[0].line) if stuck.script else None
    put_there = f", a line the converter wrote for {change}" if change else ""
    frames = ([stuck.waits_in] if stuck.waits_in else []) + list(stuck.script)
    return {"process": label, "summary": f"{stuck}{put_there}", "frames": [str(frame) for frame in frames], "change": change}


def recut_failure(plan: Plan) -> str | None:
    """The reference failing on the larger batches verify re-cut for it, where no rank failed: one line
    that says so (most likely a shape written with the script's batch size), or None."""
    error, record = plan.file("error", REFERENCE, 0), plan.file("record", REFERENCE, 0)
    ranks_failed = any(os.path.exists(plan.file("error", CANDIDATE, rank)) for rank in range(plan.candidate.ranks))
    if ranks_failed or not (os.path.exists(error) and os.path.exists(record)):
        return None
    recut = Record.load(record).flags.get(RECUT_FLAG)
    if recut is None:
        return None
    where = raise_location(error, plan.reference.script)
    return (f"the reference failed on the batches verify re-cut for it ({recut}), where no rank failed"
            f"{f', at {where}' if where else ''}: {exception_line_in(error)}; a shape written with the script's batch size "
            f"(x.reshape(batch_size, -1), a hidden state of batch_size rows) cannot take the larger batch: write it "
            f"from the batch (x.size(0)) for verify to compare this script")


def with_global_batch(plan: Plan, runs: list) -> tuple[Plan, str | None]:
    """Where the reference failed on the batch verify re-cut for it (N ranks x the script's batch, see
    recut_failure) and the script sets its batch where verify can (plan.ScriptBatch), run the reference
    again with N times the script's batch written there, re-cut as N ranks x the script's (its `runs[0]`
    replaced): a shape written with the batch size then takes it. The plan it ran under, and a note."""
    if plan.script_batch is None or plan.batch_mode != "per-gpu" or not recut_failure(plan):
        return plan, None
    failed = exception_line_in(plan.file("error", REFERENCE, 0))
    plan = replace(plan, global_batch=True)
    plan.save()
    for kind in ("error", "record", "stack", "log"):
        if os.path.exists(plan.file(kind, REFERENCE, 0)):
            os.remove(plan.file(kind, REFERENCE, 0))
    deadline = time.time() + plan.timeout
    os.environ[harness.DEADLINE_ENV] = repr(deadline)
    runs[0] = fork_role(plan, REFERENCE, {})
    wait_for(runs[:1], deadline)
    batch = plan.script_batch
    return plan, (f"the reference failed on the batch verify re-cut for it ({plan.nproc} ranks x {batch.value}: {failed}); "
                  f"it ran again with the global batch set where the script sets it, {batch.where} made "
                  f"{plan.nproc * batch.value}, each step re-cut as {plan.nproc} ranks x {batch.value}")


def result_of(plan: Plan, killed: dict[tuple[str, int], int]) -> dict:
    """The verdict dict for result.json (`killed`: see signalled)."""
    problem, hangs = failure_message(plan, killed)
    if problem:
        return {**error_result(problem), "hangs": hangs}
    reference = Record.load(plan.file("record", REFERENCE, 0))
    ranks = [Record.load(plan.file("record", CANDIDATE, rank)) for rank in range(plan.candidate.ranks)]
    return judge(plan, reference, ranks)


def shared_gpu_problem(plan: Plan) -> str | None:
    """For --device cuda: a reason to stop, after choosing nccl (one GPU per rank) or gloo on one shared GPU."""
    count = torch.cuda.device_count()  # counted through NVML: CUDA stays uninitialized for the forks
    if not count:
        return "--device cuda needs CUDA, and torch sees no GPU here"
    if count < plan.nproc and plan.target == "fsdp":
        return (f"FSDP needs a GPU per rank: {plan.nproc} ranks cannot share {count} GPU(s) (NCCL refuses a GPU twice, "
                f"and gloo has no reduce-scatter for CUDA tensors); use --nproc {count} or more GPUs")
    if count < plan.nproc:
        os.environ[harness.SHARED_GPU_ENV] = "1"
    return None


def dataparallel_setup(plan: Plan) -> Plan:
    """DataParallel splits each batch over every GPU it sees; with fewer than two GPUs its
    replicas are simulated in the candidate's process (plan.dp_replicas of them)."""
    if plan.target != "dp":
        return plan
    gpus = torch.cuda.device_count()
    return replace(plan, dp_replicas=gpus) if gpus >= 2 else replace(plan, dp_simulated=True)


def describe_dataparallel(plan: Plan, result: dict) -> None:
    """Say in the verdict how DataParallel ran, so that the report tells what was proven."""
    if plan.target != "dp":
        return
    result["dataparallel"] = {"replicas": plan.dp_replicas, "simulated": plan.dp_simulated}
    if plan.dp_simulated:
        note = (f"DataParallel simulated with {plan.dp_replicas} replicas in one process on {plan.device} (fewer than "
                f"2 GPUs here): each batch is scattered along dim 0, the module replicated and the outputs gathered "
                f"as on {plan.dp_replicas} GPUs, so a loss returned by forward comes back as {plan.dp_replicas} values, "
                f"attributes set in forward are lost, BatchNorm normalizes each chunk")
    else:
        note = f"DataParallel ran on the {plan.dp_replicas} GPUs here"
    result["notes"].insert(0, note)


def main() -> None:
    plan_path = sys.stdin.readline().strip()
    if not plan_path:  # the command found no candidate to run
        return
    plan = dataparallel_setup(Plan.load(plan_path))
    plan.save()
    problem = shared_gpu_problem(plan) if plan.device == "cuda" else None
    if problem:
        result = error_result(problem)
    else:
        deadline = time.time() + plan.timeout
        os.environ[harness.DEADLINE_ENV] = repr(deadline)
        runs, _store = start_runs(plan, plan_path)  # the store serves until this process exits
        wait_for(runs, deadline)
        plan, retried = with_global_batch(plan, runs)
        result = result_of(plan, signalled(plan, runs))
        result["notes"][:0] = [retried] if retried else []
    describe_dataparallel(plan, result)
    with open(plan.result_path, "w") as f:
        json.dump(result, f, indent=1)
    os._exit(0)


if __name__ == "__main__":
    main()
