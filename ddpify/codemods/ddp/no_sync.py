"""Transform 10: gradient accumulation skips the all-reduce on micro-steps with `model.no_sync()`.

In a step loop whose `optimizer.step()` sits under a condition (`if (i + 1) % accum == 0:`), the
statements from the model's forward through `backward()` run under
`model.no_sync() if not <condition> else contextlib.nullcontext()`: gradients still accumulate
locally, and are averaged across ranks once, on the micro-step that steps the optimizer.
"""

from __future__ import annotations

import ast
from typing import Sequence

import libcst as cst

from ddpify.anatomy import LoopSite
from ddpify.codemods.base import Transform
from ddpify.edits.statements import enclose


class NoSyncAccumulation(Transform):
    """Skip gradient all-reduce on accumulation micro-steps with model.no_sync()."""

    NAME = "no_sync"
    SEES_EDITS_OF = ()

    def plan(self) -> None:
        for loop in self.anatomy.step_loops:
            if loop.trains:
                self._plan_loop(loop)

    def _plan_loop(self, loop: LoopSite) -> None:
        body: list[ast.stmt] = loop.node.body  # type: ignore[attr-defined]
        condition = self._step_condition(body)
        if condition is None:
            return
        span = self.anatomy.forward_to_backward(body)
        if span is None:
            self.advise(loop.line, "gradient accumulation: wrap forward and backward in model.no_sync() on micro-steps by hand")
            return
        first, last, forward = span
        model = ast.unparse(forward.func)
        assigned = {n.id for s in body[first:last + 1] for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        if assigned & {n.id for n in ast.walk(condition) if isinstance(n, ast.Name)}:
            self.advise(loop.line, "gradient accumulation: the step condition depends on the micro-step's own results; add no_sync by hand")
            return
        self.skip_sync(loop, body[first:last + 1], model, condition)

    def skip_sync(self, loop: LoopSite, statements: list[ast.stmt], model: str, condition: ast.expr) -> None:
        """Run the forward-to-backward statements without gradient sync unless the condition holds."""
        context = f"{self.no_sync(model)} if not ({ast.unparse(condition)}) else contextlib.nullcontext()"
        self.add_import("contextlib")
        run_under(self, statements, context, ("no_sync", loop.line))
        self.changed(statements[0].lineno, f"accumulation micro-steps run under {self.no_sync(model)} (one all-reduce per optimizer step)")

    def no_sync(self, model: str) -> str:
        """The context in which `model`'s backward skips the gradient all-reduce."""
        return f"{model}.no_sync()"

    def _step_condition(self, body: list[ast.stmt]) -> ast.expr | None:
        """The test of the `if` (directly in the loop body) that holds `optimizer.step()`."""
        for stmt in body:
            if isinstance(stmt, ast.If) and not stmt.orelse and self.anatomy.body_contains(stmt.body, self.anatomy.is_training_call):
                if not any(self.anatomy.is_training_call(n) and n.func.attr == "backward" for n in ast.walk(stmt)):  # type: ignore[attr-defined]
                    return stmt.test
        return None


def run_under(transform: Transform, statements: Sequence[ast.stmt], context: str, group: object, why: str = "") -> None:
    """Put the statements (a straight run of one block) in `with <context>:`, under a `# ddpify: <why>` comment
    when `why` is given; `group` tells this run from others next to it."""
    comment = [cst.EmptyLine(comment=cst.Comment(f"# ddpify: {why}"))] if why else []

    def build(run: Sequence[cst.BaseStatement]) -> cst.BaseCompoundStatement:
        block = enclose(run, f"with {context}:\n    pass\n")
        return block.with_changes(leading_lines=[*block.leading_lines, *comment])

    for stmt in statements:
        transform.group_statement(stmt, group, build)
