"""Objects whose output rank 0 alone makes, reached from code that every rank runs.

A progress bar is disabled on the other ranks (`disable=RANK != 0`), but a disabled tqdm bar holds
only a few attributes (`n`, `total`, ...): a script that reads its `desc` or `start_t` on every rank
crashed there with AttributeError (and rank 0 then lost its peer). Such a bar is drawn to os.devnull
on the other ranks instead. Proven by running the conversion on 2 ranks, bounded by a timeout.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from ddpify.convert import convert_source
from helpers import failure_report, run_script

BAR_READ = textwrap.dedent("""\
    import time

    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    from tqdm import tqdm

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))), batch_size=8, shuffle=True)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        bar = tqdm(loader, desc=f"epoch {epoch}")
        for x, y in bar:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            bar.set_description(bar.desc.split(" loss")[0] + f" loss {loss.item():.3f}")
        print(f"epoch {epoch} timed: {time.time() - bar.start_t >= 0}")
    """)


def test_a_bar_whose_attributes_every_rank_reads_is_drawn_to_devnull_off_rank_zero(tmp_path: Path):
    result = convert_source(BAR_READ, "ddp")
    assert not result.missing, result.missing
    assert 'tqdm(loader, desc=f"epoch {epoch}", file=None if RANK == 0 else open(os.devnull, "w"))' in result.output
    (tmp_path / "train.py").write_text(result.output)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    run = run_script(torchrun, tmp_path, timeout=180)
    assert run.returncode == 0, failure_report(run)
    assert run.stdout == "epoch 0 timed: True\nepoch 1 timed: True\n"


def test_a_bar_read_only_in_rank_zero_output_stays_disabled_elsewhere():
    printed = BAR_READ.replace('bar.set_description(bar.desc.split(" loss")[0] + f" loss {loss.item():.3f}")', "print(bar.desc)")
    output = convert_source(printed.replace("time.time() - bar.start_t >= 0", "True"), "ddp").output
    assert 'tqdm(loader, desc=f"epoch {epoch}", disable=RANK != 0)' in output

