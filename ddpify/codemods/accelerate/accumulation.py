"""When a script's gradient accumulation is exactly `accelerator.accumulate(model)`'s.

Under `accumulate`, with `accelerator.gradient_accumulation_steps = N`, the Accelerator counts the
micro-steps of the prepared loader's pass: it syncs the gradients (and lets the prepared optimizer
step and zero its gradients) on every N-th and on the pass's last, skips the all-reduce otherwise,
and `accelerator.backward` divides the loss by N. That is the script's own accumulation where:

- the loop walks `enumerate(loader)` of a training loader (its count restarts with each pass, as the
  Accelerator's does), leaves it by no `break`, and steps under `(i + 1) % N == 0`, optionally
  `or i + 1 == len(loader)` (a partial last group the script steps on, as the Accelerator does; one
  it leaves unstepped is synced there, which changes nothing: the average of the ranks' sums is
  linear, and the next sync averages alike what follows);
- the loss it backpropagates is divided by that same N, in the backward's own receiver
  (`(loss / N).backward()`) or in the assignment of a loss nothing else reads: the division goes,
  since `accelerator.backward` makes it.

Elsewhere (a step counter of the script's own, a divided loss that is logged, no division) the
script keeps its form, under `accelerator.no_sync(model)` on the micro-steps, and the advice says why.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ddpify.anatomy import Anatomy, LoopSite


@dataclass(frozen=True)
class Accumulation:
    """What `accumulate` takes over: the number of micro-steps per optimizer step and the division to drop."""

    steps: ast.expr
    division: ast.BinOp  # `<loss> / N`, in the backward's receiver or the assignment of the loss


def accelerate_accumulation(a: Anatomy, loop: LoopSite, statements: list[ast.stmt], condition: ast.expr) -> Accumulation | str:
    """The accumulation `accumulate` does exactly as the loop does, or why it would not."""
    counter = _pass_counter(a, loop)
    if counter is None:
        return "the loop does not count the micro-steps of a training loader's pass with enumerate(loader)"
    if any(isinstance(node, ast.Break) for node in ast.walk(loop.node)):
        return "the loop may leave a pass early (break), where the Accelerator would not sync"
    steps = _steps_of(condition, counter, loop)
    if steps is None:
        return f"the step condition is not `({counter} + 1) % N == 0` (with the last partial group or not)"
    backward = next((site.node for site in a.training_calls if isinstance(site.node.func, ast.Attribute)  # type: ignore[attr-defined]
                     and site.node.func.attr == "backward" and any(site.node in ast.walk(s) for s in statements)), None)
    receiver = backward.func.value if backward is not None else None  # type: ignore[attr-defined]
    if _divided_by(receiver, steps):
        return Accumulation(steps, receiver)  # type: ignore[arg-type]
    assignment = _divided_loss(a, receiver, steps, statements)
    return assignment if isinstance(assignment, str) else Accumulation(steps, assignment.value)  # type: ignore[arg-type]


def _pass_counter(a: Anatomy, loop: LoopSite) -> str | None:
    """`i` of `for i, batch in enumerate(loader)` over a training loader (no start)."""
    node = loop.node
    if not (isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and a.qualname(node.iter.func) == "enumerate"
            and len(node.iter.args) == 1 and not node.iter.keywords and loop.loader is not None and loop.loader.is_train):
        return None
    target = node.target
    first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else None
    return first.id if isinstance(first, ast.Name) else None


def _steps_of(condition: ast.expr, counter: str, loop: LoopSite) -> ast.expr | None:
    """N of `(i + 1) % N == 0`, alone or `or i + 1 == len(loader)`."""
    tests = condition.values if isinstance(condition, ast.BoolOp) and isinstance(condition.op, ast.Or) else [condition]
    if len(tests) > 2 or (len(tests) == 2 and not _last_of_pass(tests[1], counter, loop)):
        return None
    test = tests[0]
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and ast.unparse(test.comparators[0]) == "0" and isinstance(test.left, ast.BinOp) and isinstance(test.left.op, ast.Mod)):
        return None
    return test.left.right if ast.unparse(test.left.left) == f"{counter} + 1" else None


def _last_of_pass(test: ast.expr, counter: str, loop: LoopSite) -> bool:
    """`i + 1 == len(loader)`: the pass's last micro-step."""
    loader = ast.unparse(loop.node.iter.args[0])  # type: ignore[attr-defined]
    return isinstance(test, ast.Compare) and ast.unparse(test) in (f"{counter} + 1 == len({loader})", f"len({loader}) == {counter} + 1")


def _divided_by(expr: ast.expr | None, steps: ast.expr) -> bool:
    return isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) and ast.dump(expr.right) == ast.dump(steps)


def _divided_loss(a: Anatomy, receiver: ast.expr | None, steps: ast.expr, statements: list[ast.stmt]) -> ast.Assign | str:
    """`loss = <expr> / N` among `statements`, where `loss` (the receiver) is read by the backward alone; or why not."""
    undivided = f"the loss backpropagated is not divided by {ast.unparse(steps)} (accelerator.backward would divide it by that)"
    ref = a.ref(receiver) if isinstance(receiver, ast.Name) else None
    assignment = next((s for s in statements if isinstance(s, ast.Assign) and len(s.targets) == 1
                       and isinstance(s.targets[0], ast.Name) and a.ref(s.targets[0]) == ref), None) if ref else None
    if assignment is None or not _divided_by(assignment.value, steps):
        return undivided
    reads = [n for n in a.nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n is not receiver and a.ref(n) == ref]
    if reads:
        return (f"the divided loss is also read (line {reads[0].lineno}), where it would no longer be divided "
                f"(accelerator.backward divides by {ast.unparse(steps)} itself)")
    return assignment
