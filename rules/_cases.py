"""Pieces and builders of the VALID and INVALID cases that several rules share (no rule is defined here)."""

from __future__ import annotations

import textwrap

from ddpify.lint import Invalid

# The little model of the cases: a submodule (`fc`) and a method of its own (`predict`).
NET = """class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

    def predict(self, x):
        return self(x).argmax(1)
"""


# An Accelerate script's head: the Accelerator, and the model of the cases prepared with its optimizer.
ACCELERATE_HEAD = """import torch
from torch import nn
from accelerate import Accelerator


""" + NET + """

accelerator = Accelerator()
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
"""
ON_MAIN_PROCESS = "accelerator.is_main_process"


def guarded_case(before: str, statement: str, test: str = "rank == 0", after: str = "") -> Invalid:
    """A case reported on `statement`, between `before` and `after`, that its fix puts under
    `if <test>:` (`rank_zero_guard_fix`)."""
    indent = statement[: len(statement) - len(statement.lstrip(" "))]
    guarded = f"{indent}if {test}:\n{textwrap.indent(statement, '    ')}"
    return Invalid(before + statement + after, line=before.count("\n") + 1, fixed=before + guarded + after)


# the wrapper's state copied in memory and loaded back into the same wrapper: no checkpoint
IN_MEMORY_COPY = "import copy\nbest = copy.deepcopy(model.state_dict())\nmodel.load_state_dict(best)\n"


def saved_state_dict_cases(head: str) -> tuple[Invalid, ...]:
    """The wrapper `model` that `head` builds saving its own state dict, directly and inside a
    checkpoint dict; fixed, it saves the state dict of `model.module`."""
    return tuple(
        Invalid.fixed_by(head + code, old="model.state_dict()", new="model.module.state_dict()")
        for code in (
            "torch.save(model.state_dict(), 'model.pt')\n",
            "ckpt = {'model': model.state_dict(), 'epoch': 3}\ntorch.save(ckpt, 'ckpt.pt')\n",
        )
    )
