"""DDP020: training or an evaluation through the DDP wrapper that only some ranks run."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.every_rank_work import function_calls_collective, is_collective, joins_by_itself, may_run_wrapper_forward
from ddpify.anatomy.distributed.ranks import under_rank_test
from ddpify.anatomy.distributed.wrappers import wrap_calls
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import ACCELERATE_HEAD, ON_MAIN_PROCESS
from ddpify.rules._ddp import DDP_AND_ACCELERATE


class WorkUnderRankCondition(Rule, code="DDP020", name="work-under-rank-condition", severity="error"):
    """## What it does
    Flags a call that only some ranks make (under `if rank == 0:`, after `dist.get_rank() == 0 and`,
    after an early `return` of the other ranks) and that joins the other ranks without saying so:
    one that trains (`loss.backward()`, `optimizer.step()`, or a function of this file that does),
    or one that may run the DDP wrapper's forward, handed it or reading it itself
    (`print(evaluate(model, loader))` where `evaluate` calls `model(x)`, `print(predict(x))` where
    `predict` calls the global `model`, a library function given the wrapper). The collectives
    themselves and a forward written under the rank test are DDP002's.

    Hugging Face Accelerate scripts are checked too: `accelerator.backward(loss)` trains, and the
    wrapper is the model `accelerator.prepare` returned (`accelerator.unwrap_model(model)` is its
    plain module).

    ## Why is this bad?
    The work hides collectives. A DDP forward broadcasts buffers (BatchNorm statistics) from rank
    0 and its backward all-reduces the gradients: every rank must take part. When rank 0 alone
    evaluates or trains inside its logging, it waits in the first of them for ranks that are
    already elsewhere (or waiting in their own next collective), and the job hangs until the
    NCCL timeout kills it. Work hidden in a print's f-string is easy to miss in review.

    ## Example
    ```python
    if rank == 0:
        print(f"val acc {evaluate(model, val_loader):.4f}")
    ```

    ## Use instead
    ```python
    val_acc = evaluate(model, val_loader)  # every rank
    if rank == 0:
        print(f"val acc {val_acc:.4f}")
    ```
    or evaluate the plain module on rank 0 alone: `evaluate(model.module, val_loader)`.

    ## Fix safety
    No fix: whether every rank should compute it (and whether the evaluation should be sharded)
    or rank 0 should use the plain module needs a decision.
    """

    message = "runs on some ranks only but joins every rank (training, or the DDP wrapper's forward): the job hangs"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        for site in a.calls:
            call: ast.Call = site.node  # type: ignore[assignment]
            why = under_rank_test(a, call) and _hidden_work(a, call)
            if why:
                yield Finding(site.pos, f"`{ast.unparse(call.func)}(...)` runs on some ranks only but {why}: "
                                        "the other ranks never join it and the job hangs")


def _hidden_work(a, call: ast.Call) -> str | None:
    """What `call` makes every rank join, unless DDP002 reports it (a collective, in a function of
    this file too, or the wrapper's own forward)."""
    callee = a.callee(call)
    if is_collective(a, call) or (callee and function_calls_collective(a, callee)):
        return None
    if joins_by_itself(a, call) and not _before_every_wrap(a, call):
        return "trains (DDP's backward all-reduces the gradients, a collective every rank must join)"
    if may_run_wrapper_forward(a, call):
        return "may run the DDP wrapper's forward, which broadcasts buffers to every rank"
    return None


def _before_every_wrap(a, call: ast.Call) -> bool:
    """Does the call run before the model is wrapped (every DDP wrap later in its own function)? Its
    backward is a plain module's, no collective (llm.c's rank-0 reference pass before `DDP(model)`)."""
    wraps = wrap_calls(a)
    scope = syntax.enclosing_function(a, call)
    return bool(wraps) and all(syntax.enclosing_function(a, w.node) == scope and w.line > call.lineno for w in wraps)  # type: ignore[attr-defined]


_HEAD = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(8, 4) for _ in range(4)]


def evaluate(net, data):
    with torch.no_grad():
        return sum(net(x).mean().item() for x in data)


def train_step(x):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()


def describe(net):
    return type(net).__name__
"""

_ACCELERATE_EVALUATE = ACCELERATE_HEAD + """

def evaluate(net):
    with torch.no_grad():
        return net(torch.ones(2, 4)).sum().item()

"""

WorkUnderRankCondition.VALID = (
    _ACCELERATE_EVALUATE + f"if {ON_MAIN_PROCESS}:\n    print(evaluate(accelerator.unwrap_model(model)))\n",
    # computed on every rank, printed on rank 0
    _HEAD + "acc = evaluate(model, batches)\nif rank == 0:\n    print(f'acc {acc:.4f}')\n",
    # rank 0 alone evaluates the plain module
    _HEAD + "if rank == 0:\n    print(f'acc {evaluate(model.module, batches):.4f}')\n",
    # formatting and a function that never calls the wrapper
    _HEAD + "if rank == 0:\n    print(describe(model), len(batches), round(batches[0].mean().item(), 3))\n",
    # a checkpoint of the wrapper's state on rank 0
    _HEAD + "if rank == 0:\n    torch.save(model.module.state_dict(), 'm.pt')\n",
    # rank 0's reference pass on the plain model, before it is wrapped (llm.c): no collective yet
    """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    net = torch.nn.Linear(4, 1)
    if dist.get_rank() == 0:
        net(torch.randn(2, 4)).sum().backward()
    model = DDP(net)
""",
)
WorkUnderRankCondition.INVALID = (
    Invalid(_ACCELERATE_EVALUATE + f"if {ON_MAIN_PROCESS}:\n    print(evaluate(model))\n",
            line=_ACCELERATE_EVALUATE.count("\n") + 2),
    Invalid(ACCELERATE_HEAD + f"if {ON_MAIN_PROCESS}:\n    accelerator.backward(model(torch.ones(2, 4)).sum())\n",
            line=ACCELERATE_HEAD.count("\n") + 2),
    Invalid(_HEAD + "if rank == 0:\n    print(f'acc {evaluate(model, batches):.4f}')\n", line=26),
    Invalid(_HEAD + "if dist.get_rank() == 0 and evaluate(model, batches) > 0:\n    print('positive')\n", line=25),
    Invalid(_HEAD + "for x in batches:\n    if rank == 0:\n        train_step(x)\n", line=27),
    # a function that calls the wrapper it reads as a global, on every rank too
    Invalid(_HEAD + "def predict(x):\n    return model(x)\n\n\nout = predict(batches[0])\nif rank == 0:\n    print(predict(batches[1]))\n",
            line=31),
    Invalid(_HEAD + "from torchinfo import summary\nif rank == 0:\n    summary(model, input_size=(8, 4))\n", line=27),
)
