"""`accelerator.backward(loss)` for every backward, and the GradScaler handed over to Accelerate.

Accelerate scales an fp16 loss itself (in `backward`) and unscales before the prepared optimizer
steps: `scaler.scale(loss).backward()` becomes `accelerator.backward(loss)`, `scaler.step(opt)`
becomes `opt.step()`, `scaler.update()` and `scaler.unscale_(opt)` go, and so does the scaler
itself once nothing else reads it (a scaler saved in a checkpoint is left to the user).
`clip_grad_norm_` becomes `accelerator.clip_grad_norm_`, which unscales fp16 gradients first.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import ROLE_SCALER
from ddpify.anatomy.vocabulary import CLIP_GRAD_NORM, GRAD_SCALER, GRAD_SCALER_STEPS
from ddpify.codemods.accelerate.runtime import BACKWARD, CLIP_GRAD_NORM as ACCELERATOR_CLIP_GRAD_NORM
from ddpify.codemods.base import Transform
from ddpify.edits.expressions import parse_expr


class AcceleratorBackward(Transform):
    """loss.backward() -> accelerator.backward(loss); GradScaler calls handed over to Accelerate."""

    NAME = "backward"
    SEES_EDITS_OF = ()

    def plan(self) -> None:
        for site in self.anatomy.training_calls:
            call: ast.Call = site.node  # type: ignore[assignment]
            if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
                self._backward(call)
        steps = self.anatomy.calls_on(ROLE_SCALER, *GRAD_SCALER_STEPS)
        for site in steps:
            self._scaler_step(site.node, site.stmt)  # type: ignore[arg-type]
        for site in self.anatomy.calls_to(CLIP_GRAD_NORM):
            self.rewrite_node(site.node, cst.Call, lambda node: node.with_changes(func=parse_expr(ACCELERATOR_CLIP_GRAD_NORM)))
            self.changed(site.line, f"{ACCELERATOR_CLIP_GRAD_NORM}: it unscales fp16 gradients before clipping them")
        for site in self.anatomy.calls_to(GRAD_SCALER):
            self._drop_scaler(site.stmt, {site.node for site in steps})

    def _backward(self, call: ast.Call) -> None:
        receiver = call.func.value  # type: ignore[attr-defined]
        loss = self._unscaled(receiver)
        self.rewrite_node(call, cst.Call, lambda node, scaled=loss is not receiver: _through_accelerator(node, scaled))
        self.changed(call.lineno, f"{ast.unparse(call)} -> {BACKWARD}({ast.unparse(loss)}{_rest(call)})")

    def _unscaled(self, receiver: ast.expr) -> ast.expr:
        """`loss` in `scaler.scale(loss)`; the receiver itself otherwise."""
        if (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) and receiver.func.attr == "scale"
                and receiver.args and self.anatomy.has_role(receiver.func.value, ROLE_SCALER)):
            return receiver.args[0]
        return receiver

    def _scaler_step(self, call: ast.Call, stmt: ast.stmt) -> None:
        """`scaler.step(opt)` -> `opt.step()`; `scaler.update()` and `scaler.unscale_(opt)` go (statements of their own)."""
        if call.func.attr == "step" and call.args:  # type: ignore[attr-defined]
            optimizer = ast.unparse(call.args[0])
            self.rewrite_node(call, cst.Call, lambda _: parse_expr(f"{optimizer}.step()"))
            self.changed(call.lineno, f"{ast.unparse(call)} -> {optimizer}.step() (the prepared optimizer unscales and skips inf steps)")
        elif isinstance(stmt, ast.Expr) and stmt.value is call:
            self._remove(stmt)
            self.changed(call.lineno, f"{ast.unparse(call)} removed: Accelerate scales the loss itself")
        else:
            self.missing(call.lineno, "a GradScaler call Accelerate can't take over here", f"remove it by hand ({BACKWARD} scales the loss)")

    def _drop_scaler(self, stmt: ast.stmt, handled: set[ast.AST]) -> None:
        """`scaler = GradScaler(...)` goes when every read of the scaler is one handed over to Accelerate."""
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            return
        target = self.anatomy.ref(stmt.targets[0])
        reads = [n for n in self.anatomy.nodes if isinstance(n, (ast.Name, ast.Attribute)) and n is not stmt.targets[0]
                 and isinstance(getattr(n, "ctx", None), ast.Load) and self.anatomy.ref(n) == target]
        if all(self._handled_read(read, handled) for read in reads):
            self._remove(stmt)
            self.changed(stmt.lineno, f"GradScaler removed: Accelerate's mixed precision scales the loss")
        else:
            self.missing(stmt.lineno, "the GradScaler is read elsewhere (a checkpoint?) but Accelerate now owns the loss scaling",
                         "drop those reads by hand (accelerator.save_state keeps the scaler's state)")

    def _handled_read(self, read: ast.AST, handled: set[ast.AST]) -> bool:
        parent = self.anatomy.parents.get(read)
        call = self.anatomy.parents.get(parent) if isinstance(parent, ast.Attribute) else None
        return call in handled or (isinstance(parent, ast.Attribute) and parent.attr == "scale")

    def _remove(self, stmt: ast.stmt) -> None:
        alone = len(self.anatomy.block_of(stmt)) == 1
        self.rewrite_statement(stmt, lambda _: [cst.SimpleStatementLine([cst.Pass()])] if alone else [])


def _through_accelerator(node: cst.CSTNode, scaled: bool) -> cst.CSTNode:
    """`X.backward(args)` -> `accelerator.backward(X, args)`; X is `loss` of `scaler.scale(loss)` when `scaled`."""
    assert isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
    loss = node.func.value
    if scaled and isinstance(loss, cst.Call):
        loss = loss.args[0].value
    first = cst.Arg(loss, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if node.args else cst.MaybeSentinel.DEFAULT)
    return node.with_changes(func=parse_expr(BACKWARD), args=[first, *node.args])


def _rest(call: ast.Call) -> str:
    """The backward call's own arguments, after the loss."""
    given = [ast.unparse(a) for a in call.args] + [ast.unparse(k) for k in call.keywords]
    return "".join(f", {a}" for a in given)
