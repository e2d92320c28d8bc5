"""Files removed on rank 0 only: a script that keeps one checkpoint per epoch and deletes the older ones.

Run by every rank, `os.remove` of the same file is done by the first rank and the others find it
gone (FileNotFoundError, rank 1 crashed: the shape of pyGAT's training script). The conversion removes
on rank 0 only, and where the script read the file it removes, the other ranks read it first.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from ddpify.convert import convert_source
from helpers import failure_report, run_script


# One checkpoint per epoch; the older ones than the best deleted as it goes, the others at the end,
# the best loaded back. Validation loss is the same on every rank (the model is): so is the best epoch.
KEEPS_THE_BEST_CHECKPOINT = textwrap.dedent("""\
    import glob
    import os

    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    x_val, y_val = torch.randn(16, 4), torch.randn(16, 1)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    state = torch.load(os.environ["WARM_START"]) if "WARM_START" in os.environ else None
    if state is not None:
        os.remove(os.environ["WARM_START"])
    best, best_epoch = float("inf"), 0
    for epoch in range(6):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            val = nn.functional.mse_loss(model(x_val), y_val).item()
        torch.save(model.state_dict(), f"{epoch}.pkl")
        if val < best:
            best, best_epoch = val, epoch
        for file in glob.glob("*.pkl"):
            if int(file.split(".")[0]) < best_epoch:
                os.remove(file)
    for file in glob.glob("*.pkl"):
        if int(file.split(".")[0]) > best_epoch:
            os.remove(file)
    model.load_state_dict(torch.load(f"{best_epoch}.pkl"))
    print("best epoch", best_epoch)
    """)
# Makes the race certain: each rank lists the files, then waits until every rank has listed them (or 5 s
# have passed: a rank that never lists does not hang the test) before it acts, so that no rank removes a
# file before the others have listed it. (A fixed 0.5 s sleep a listing did the same at 3.5 s a run.)
LIST_THEN_WAIT = textwrap.dedent("""\
    import glob
    import os
    import time

    _listed = glob.glob
    _listings = 0


    def _list_then_wait(pattern):
        global _listings
        files = _listed(pattern)
        _listings += 1
        open(f".listed-{_listings}-rank-{os.environ['RANK']}", "w").close()
        deadline = time.monotonic() + 5
        while len(_listed(f".listed-{_listings}-rank-*")) < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
            time.sleep(0.002)
        return files


    glob.glob = _list_then_wait
    """)


def test_older_checkpoints_are_removed_by_rank_zero_alone(tmp_path: Path):
    result = convert_source(KEEPS_THE_BEST_CHECKPOINT, "ddp")
    assert not result.missing, result.missing
    assert result.output.count("if RANK == 0:\n                os.remove(file)") == 1, result.output
    (tmp_path / "train.py").write_text(LIST_THEN_WAIT + result.output)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    run = run_script(torchrun, tmp_path, timeout=180)
    assert run.returncode == 0, failure_report(run)
    assert run.stdout.count("best epoch") == 1
    assert sorted(p.name for p in tmp_path.glob("*.pkl")) == [run.stdout.split()[-1] + ".pkl"]


def test_a_file_read_then_removed_is_removed_once_every_rank_has_read_it():
    output = convert_source(KEEPS_THE_BEST_CHECKPOINT, "ddp").output
    read, barrier = output.index('torch.load(os.environ["WARM_START"]'), output.index("dist.barrier()  # every rank has read")
    assert read < barrier < output.index('os.remove(os.environ["WARM_START"])')
