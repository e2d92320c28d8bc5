"""DDP012: gradient accumulation that all-reduces on every micro-batch."""

from __future__ import annotations

import ast
import textwrap

from ddpify.anatomy.distributed.wrappers import uses_no_sync
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import ACCELERATE_HEAD
from ddpify.rules._ddp import DDP_AND_ACCELERATE, wraps_models


class AccumulationWithoutNoSync(Rule, code="DDP012", name="accumulation-without-no-sync", severity="warning"):
    """## What it does
    Flags `loss.backward()` in a training loop that accumulates gradients — the optimizer steps
    only under a condition like `if (i + 1) % accum_steps == 0:` while backward runs on every
    batch — when the script never uses `model.no_sync()`. In a Hugging Face Accelerate script
    (the model `accelerator.prepare` wrapped, `accelerator.backward(loss)`) the skips are
    `accelerator.no_sync(model)` and `accelerator.accumulate(model)`.

    ## Why is this bad?
    DDP all-reduces the gradients during every backward. With accumulation only the last
    micro-batch's all-reduce is needed; the others send the whole gradient over the network for
    nothing, so the job spends (accum_steps - 1) extra all-reduces per optimizer step. The result
    is correct, just slower — often much slower across nodes.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        sync = (i + 1) % accum_steps == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    No fix: the forward pass has to move into the `no_sync()` context too, which means
    restructuring the loop body.
    """

    message = "gradient accumulation without `model.no_sync()`: DDP all-reduces gradients on every micro-batch"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        if not wraps_models(a) or uses_no_sync(a):
            return
        for loop in a.step_loops:
            if not loop.trains:
                continue
            nodes = [n for stmt in loop.node.body for n in ast.walk(stmt)]
            steps = [n for n in nodes if syntax.method_name(n) == "step" and a.is_training_call(n)]
            for backward in (n for n in nodes if syntax.method_name(n) == "backward"):
                if any(_accumulation_guard(a, step, loop.node, backward) for step in steps):
                    yield Finding(a.pos(backward))


def _accumulation_guard(a, step: ast.Call, loop: ast.AST, backward: ast.AST) -> bool:
    """Is `step` under an `if` inside the loop that looks like an accumulation test and that
    `backward` is not under?"""
    for parent, child in syntax.ancestors(a, step):
        if parent is loop:
            return False
        if isinstance(parent, ast.If) and child is not parent.test and _looks_like_accumulation(parent.test):
            return not any(p is parent for p, _ in syntax.ancestors(a, backward)) and not _cleared_between(a, backward, step, loop)
    return False


def _cleared_between(a, backward: ast.AST, step: ast.Call, loop: ast.AST) -> bool:
    """Is this optimizer's zero_grad() called in the loop after `backward` and before `step` runs (a model
    stepped on a schedule, WGAN's `if i % n_critic == 0:`, clears its gradients first; a backward after
    the step, in the rest of its pass or in the next pass before the step): nothing carries over?"""
    receiver = ast.unparse(step.func.value)  # type: ignore[attr-defined]
    clears = [n.lineno for n in ast.walk(loop)
              if syntax.method_name(n) == "zero_grad" and ast.unparse(n.func.value) == receiver]  # type: ignore[attr-defined]
    after, before = backward.lineno, step.lineno  # type: ignore[attr-defined]
    if after < before:
        return any(after < line < before for line in clears)
    return any(line > after or line < before for line in clears)


def _looks_like_accumulation(test: ast.AST) -> bool:
    return syntax.contains(test, lambda n: (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)) or "accum" in (syntax.identifier(n) or ""))


_HEAD = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
loader = DataLoader(data, sampler=DistributedSampler(data, shuffle=False))
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
accum_steps = 4
"""

# Accelerate: the prepared model, and a loader prepared after it; a loss averaged over 4 micro-batches.
_ACCELERATE = ACCELERATE_HEAD + """from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=2)
loader = accelerator.prepare(loader)
"""
_ACCELERATE_STEP = """    accelerator.backward(nn.functional.cross_entropy(model(x), y) / 4)
    if (i + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
"""

AccumulationWithoutNoSync.VALID = (
    _ACCELERATE + "for i, (x, y) in enumerate(loader):\n    with accelerator.accumulate(model):\n"
    + textwrap.indent(_ACCELERATE_STEP, "    "),
    _HEAD + """import contextlib
for i, (x, y) in enumerate(loader):
    sync = (i + 1) % accum_steps == 0
    with contextlib.nullcontext() if sync else model.no_sync():
        loss = (model(x) - y).pow(2).mean() / accum_steps
        loss.backward()
    if sync:
        opt.step()
        opt.zero_grad()
""",
    # a second model stepped on a schedule (WGAN's n_critic): its gradients are cleared in the same block
    _HEAD + """critic = DDP(torch.nn.Linear(4, 1))
opt_c = torch.optim.SGD(critic.parameters(), lr=0.1)
for i, (x, y) in enumerate(loader):
    opt_c.zero_grad()
    critic(x).mean().backward()
    opt_c.step()
    if i % 5 == 0:
        opt.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        opt.step()
""",
    _HEAD + """critic = DDP(torch.nn.Linear(4, 1))
opt_c = torch.optim.SGD(critic.parameters(), lr=0.1)
for i, (x, y) in enumerate(loader):
    opt_c.zero_grad()
    critic(x).mean().backward()
    opt_c.step()
    opt.zero_grad()
    if i % 5 == 0:
        (model(x) - y).pow(2).mean().backward()
        opt.step()
""",
    # a backward after the scheduled step (a discriminator's loss on the generator's output) whose
    # gradients the next pass clears before that step
    _HEAD + """critic = DDP(torch.nn.Linear(1, 1))
opt_c = torch.optim.SGD(critic.parameters(), lr=0.1)
for i, (x, y) in enumerate(loader):
    opt.zero_grad()
    out = model(x)
    if i % 2 == 0:
        (out - y).pow(2).mean().backward(retain_graph=True)
        opt.step()
    opt_c.zero_grad()
    critic(out).mean().backward()
    opt_c.step()
""",
    # no accumulation: an optimizer step per batch
    _HEAD + """for x, y in loader:
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
""",
)
AccumulationWithoutNoSync.INVALID = (
    Invalid(_ACCELERATE + "for i, (x, y) in enumerate(loader):\n" + _ACCELERATE_STEP, line=_ACCELERATE.count("\n") + 2),
    Invalid(
        _HEAD + """for i, (x, y) in enumerate(loader):
    loss = (model(x) - y).pow(2).mean() / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0:
        opt.step()
        opt.zero_grad()
""",
        line=14,
    ),
)
