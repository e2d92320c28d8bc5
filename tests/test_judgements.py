"""One judgement of rank-0 output (ddpify.anatomy.output), asked by both sides: for each call in one
table, `convert --to ddp` puts it on rank 0 exactly when lint (DDP006, DDP007) reports it running
on every rank, at the call or where the object it writes through is built."""

from __future__ import annotations

import textwrap

import pytest

from ddpify.convert import convert_source
from ddpify.lint.engine import RuleSet, check_text
from ddpify.lint.registry import all_rules

HEAD = textwrap.dedent("""\
    import logging
    import pickle
    import shutil

    import matplotlib.pyplot as plt
    import numpy as np
    import torch
    import wandb
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    logger = logging.getLogger(__name__)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)
    for x in loader:
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
""")
# Launched with torchrun, the same script already distributed: what lint judges.
DISTRIBUTED = "import torch.distributed as dist\n\ndist.init_process_group('gloo')\n"

# (what builds the object the call writes through, the call, is it rank-0 output?)
CALLS = [
    ("", "print('done')", True),
    ("", "logging.info('done')", True),
    ("", "logger.debug('done')", True),
    ("", "logging.log(logging.INFO, 'done')", True),
    ("", "logger.warning('disk almost full')", False),  # what one rank saw: each rank keeps its own
    ("", "logging.error('failed')", False),
    ("", "tqdm.write('done')", True),
    ("bar = tqdm(range(2))", "bar.write('done')", True),
    ("writer = SummaryWriter('runs')", "writer.add_scalar('loss', 1.0)", True),
    ("run = wandb.init(project='p')", "wandb.log({'loss': 1.0})", True),
    ("", "wandb.Image(np.zeros((2, 2)))", False),
    ("", "torch.save(opt.state_dict(), 'optimizer.pt')", True),
    ("", "np.save('loss.npy', loss.item())", True),
    ("", "pickle.dump([1.0], open('losses.pkl', 'wb'))", True),
    ("", "plt.savefig('loss.png')", True),
    ("", "shutil.copyfile('optimizer.pt', 'best.pt')", True),
    ("", "np.mean([1.0, 2.0])", False),
]


def _script(setup: str, call: str) -> str:
    return HEAD + (setup + "\n" if setup else "") + call + "\n"


def _converted_on_rank_zero(setup: str, call: str) -> bool:
    output = convert_source(_script(setup, call), "ddp", path="train.py").output
    assert call in output.splitlines() or f"    {call}" in output.splitlines()
    return f"if RANK == 0:\n    {call}\n" in output


def _linted_on_every_rank(setup: str, call: str) -> bool:
    script = DISTRIBUTED + _script(setup, call)
    lines = script.splitlines()
    reported_at = {lines.index(call) + 1} | ({lines.index(setup) + 1} if setup else set())
    diagnostics, errors = check_text(script, "train.py", RuleSet(all_rules()))
    assert not errors
    return any(d.code in ("DDP006", "DDP007") and d.pos.line in reported_at for d in diagnostics)


@pytest.mark.parametrize(("setup", "call", "rank_zero"), CALLS, ids=[call for _, call, _ in CALLS])
def test_convert_and_lint_judge_rank_zero_output_alike(setup, call, rank_zero):
    assert _converted_on_rank_zero(setup, call) is rank_zero
    assert _linted_on_every_rank(setup, call) is rank_zero
