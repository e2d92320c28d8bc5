"""Evaluation over sharded loaders, its rows gathered with `accelerator.gather_for_metrics`.

An evaluation loop that only counts over rows (`correct += (preds == y).sum().item()`,
`total += y.size(0)`) or collects rows (`preds.append(out.argmax(dim=1))`) runs on a prepared loader:
each process evaluates its share of the batches (Accelerate pads the last ones with repeated
samples so that every process runs as many), and right after the model's outputs are bound,
`out, y = accelerator.gather_for_metrics((out, y))` joins every process's rows and drops the
repeats. What follows in the loop sees the whole set's rows once each, so the counts and lists
after the loop are the single-process ones, on every process.

A loop that adds a value per batch (a mean loss's `.item()`, `batches += 1`) would add one per
gathered group of batches instead: it stays on the whole set on every process (the metric of one
process, no speed-up), and a comment above it says why; so does any loop the DDP target can't shard
(ddpify.anatomy.evaluation). A loader is prepared only when every loop over it gathers.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy.distributed.accelerate import ROW_METHODS, ROW_METHODS_ALONG_A_DIM, ROW_SUMS
from ddpify.anatomy.evaluation import EvaluationLoop, evaluation_loops, model_reads, shardable
from ddpify.anatomy.losses import loss_terms, sums_over_batch
from ddpify.codemods.accelerate.runtime import GATHER_FOR_METRICS, PREPARE
from ddpify.codemods.base import Transform

_WHOLE = "ddpify: evaluated on the whole set on every process (the metric of one process, no speed-up):"


class AcceleratorEvaluation(Transform):
    """Prepare evaluation loaders whose loops count or collect rows, and gather each batch's rows for the metric."""

    NAME = "evaluation"
    SEES_EDITS_OF = ()

    def plan(self) -> None:
        evaluations = evaluation_loops(self.anatomy)
        reasons = {id(e): self._why_whole(e) for e in evaluations}
        while True:  # a loader another loop keeps whole stays whole for every loop over it
            whole = {ld for e in evaluations if reasons[id(e)] for ld in e.loaders}
            shared = [e for e in evaluations if not reasons[id(e)] and e.loaders & whole]
            if not shared:
                break
            for e in shared:
                reasons[id(e)] = "its loader is also evaluated by a loop that stays on the whole set"
        for evaluation in evaluations:
            if reasons[id(evaluation)]:
                self._keep_whole(evaluation, reasons[id(evaluation)])  # type: ignore[arg-type]
        gathering = [e for e in evaluations if not reasons[id(e)]]
        for loader in sorted({ld for e in gathering for ld in e.loaders}, key=lambda ld: ld.line):
            name = loader.target.name  # type: ignore[union-attr]
            self.insert_after(loader.stmt, f"{name} = {PREPARE}({name})\n")
            self.changed(loader.line, f"evaluation loader prepared: each process evaluates its share of the batches ({PREPARE})")
        for evaluation in gathering:
            self._gather(evaluation)

    def _why_whole(self, evaluation: EvaluationLoop) -> str | None:
        """Why the loop stays on the whole set on every process (None: its rows are gathered)."""
        if self.options.eval == "whole":
            return "--eval whole"
        if evaluation.problem:
            return evaluation.problem
        if evaluation not in shardable(self.anatomy)[1]:
            return "its loader is also iterated by a loop that can't be sharded"
        unnamed = [ld for ld in evaluation.loaders if ld.target is None or not isinstance(ld.stmt, ast.Assign)]
        if unnamed:
            return "its loader is not bound to a name to prepare"
        found = _model_outputs(self.anatomy, evaluation)
        return found if isinstance(found, str) else _per_batch_value(self.anatomy, evaluation, set(found[1]))

    def _keep_whole(self, evaluation: EvaluationLoop, why: str) -> None:
        comment = cst.EmptyLine(comment=cst.Comment(f"# {_WHOLE} {why}"))
        self.rewrite_in_place(evaluation.loop.node, lambda s: s.with_changes(leading_lines=[*s.leading_lines, comment]))  # type: ignore[arg-type]
        self.advise(evaluation.loop.line, f"evaluation left on the whole set on every process: {why}")

    def _gather(self, evaluation: EvaluationLoop) -> None:
        outputs, names = _model_outputs(self.anatomy, evaluation)  # type: ignore[misc]
        joined = ", ".join(names)
        self.insert_after(outputs, f"{joined} = {GATHER_FOR_METRICS}(({joined}{',' if len(names) == 1 else ''}))\n")
        self.changed(outputs.lineno, f"{joined} gathered from every process ({GATHER_FOR_METRICS}: the last batch's repeats "
                                     "dropped): the metric after the loop is the whole set's, on every process")
        self.fulfil()


def _model_outputs(a, evaluation: EvaluationLoop) -> tuple[ast.Assign, list[str]] | str:
    """The statement of the loop's body that binds the model's outputs to one name, and the names to gather
    after it: that name, and the batch's names (the loop's targets, names bound before it) read later."""
    body: list[ast.stmt] = evaluation.loop.node.body  # type: ignore[attr-defined]
    reads = {id(r.node) for r in model_reads(a, evaluation)}
    calling = [s for s in body if any(id(n) in reads for n in ast.walk(s))]
    outputs = calling[0] if len(calling) == 1 else None
    if not (isinstance(outputs, ast.Assign) and len(outputs.targets) == 1 and isinstance(outputs.targets[0], ast.Name)
            and _rows_of(outputs.value, lambda node: id(node) in reads)):
        return "the model's outputs are not bound to one name, row by row, in the loop's own body"
    index = body.index(outputs)
    bound = {n.id for n in ast.walk(evaluation.loop.node.target) if isinstance(n, ast.Name)}  # type: ignore[attr-defined]
    bound |= {n.id for s in body[:index] for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    later = [n.id for s in body[index + 1:] for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    name = outputs.targets[0].id
    return outputs, [name, *dict.fromkeys(n for n in later if n in bound and n != name)]


def _per_batch_value(a, evaluation: EvaluationLoop, rows: set[str]) -> str | None:
    """The first update of an accumulator that adds a value per batch, not its rows (None: none does): each adds
    a count or sum over the `rows` gathered (names, and those bound from them row by row), adds per row (in a
    loop over them: a confusion matrix), or collects them."""
    loop = evaluation.loop.node
    rows = rows | {n.id for s in ast.walk(loop) if isinstance(s, ast.Assign) and _rows_of(s.value, lambda v: isinstance(v, ast.Name) and v.id in rows)
                   for t in s.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    for node in ast.walk(loop):
        target = node.target.value if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript) else getattr(node, "target", None)
        if (isinstance(node, ast.AugAssign) and ast.unparse(target) in evaluation.summed and not _row_count(a, node.value, rows)
                and not _per_row(a, loop, node, rows)):
            return f"`{ast.unparse(node)}` adds a value per batch, not a count over its rows (gathered, it would add one per group of batches)"
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) in evaluation.gathered
                and node.args and not _rows_of(node.args[0], lambda n: isinstance(n, ast.Name) and n.id in rows)):
            return f"`{ast.unparse(node)}` collects a value per batch, not its rows"
    return None


def _per_row(a, loop: ast.AST, update: ast.AugAssign, rows: set[str]) -> bool:
    """Is `update` made once per row: inside a loop of the evaluation loop over the gathered rows, adding no loss?"""
    inner = [n for n in ast.walk(loop) if isinstance(n, ast.For) and n is not loop and update in ast.walk(n)]
    over_rows = any(isinstance(n, ast.Name) and n.id in rows for f in inner for n in ast.walk(f.iter))
    return over_rows and not _reads_a_loss(a, update.value)


def _rows_of(expr: ast.expr, source) -> bool:
    """Does `expr` keep the rows of a `source` node (a model call, a name) through row-keeping methods?"""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and (
            expr.func.attr in ROW_METHODS or (expr.func.attr in ROW_METHODS_ALONG_A_DIM and (expr.args or expr.keywords))):
        expr = expr.func.value
    if isinstance(expr, ast.Call) and source(expr.func):
        return True
    return source(expr)


def _row_count(a, value: ast.expr, rows: set[str]) -> bool:
    """Is `value` a count or sum over the gathered `rows`: `(preds == y).sum()` (`.item()`), `y.size(0)`,
    `y.shape[0]`, `len(y)`, or a mean over them weighted by their count (`criterion(out, y).item() * y.size(0)`)?"""
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult):
        return any(_row_count(a, count, rows) and _batch_mean(a, other) for count, other in ((value.right, value.left), (value.left, value.right)))
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "item" and not value.args:
        value = value.func.value
    counted = _counted(a, value)
    return counted is not None and any(isinstance(n, ast.Name) and n.id in rows for n in ast.walk(counted)) and not _reads_a_loss(a, counted)


def _counted(a, value: ast.expr) -> ast.expr | None:
    """The tensor whose rows `value` sums or counts (`t` of `t.sum()`, `t.size(0)`, `t.shape[0]`, `len(t)`), else None."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        whole = value.func.attr in ROW_SUMS and not value.args and not value.keywords
        return value.func.value if whole or (value.func.attr == "size" and [ast.unparse(x) for x in value.args] == ["0"]) else None
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute) and value.value.attr == "shape":
        return value.value.value if ast.unparse(value.slice) == "0" else None
    return value.args[0] if isinstance(value, ast.Call) and a.qualname(value.func) == "len" and len(value.args) == 1 else None


def _batch_mean(a, expr: ast.expr) -> bool:
    """A mean a loss call takes over the batch (`criterion(out, y).item()`): times the rows' count, their sum."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "item" and not expr.args:
        expr = expr.func.value
    return isinstance(expr, ast.Call) and loss_terms(a, expr) == [expr] and sums_over_batch(a, expr) is False


def _reads_a_loss(a, expr: ast.expr) -> bool:
    """Does `expr` compute or read a loss (a value per batch, not per row)?"""
    return any(loss_terms(a, node) for node in ast.walk(expr) if isinstance(node, (ast.Call, ast.Name)))
