"""Edits the DP transforms share: rewrite an expression, drop a statement but keep its comments."""

from __future__ import annotations

import ast
from typing import Callable

import libcst as cst

from ddpify.anatomy import Anatomy
from ddpify.codemods.base import Transform

_CST_TYPE = {
    ast.Call: cst.Call,
    ast.Subscript: cst.Subscript,
    ast.Attribute: cst.Attribute,
    ast.Name: cst.Name,
    ast.IfExp: cst.IfExp,
    ast.Constant: cst.SimpleString,
}


def rewrite_expression(transform: Transform, node: ast.expr, rewrite: Callable[[cst.CSTNode], cst.CSTNode]) -> None:
    """`Transform.rewrite_node` with the CST type that matches the ast node's."""
    transform.rewrite_node(node, _CST_TYPE[type(node)], rewrite)


def remove_statement(transform: Transform, anatomy: Anatomy, stmt: ast.stmt) -> None:
    """Drop `stmt`; the comments and blank lines above it move to the statement after it."""
    block = anatomy.block_of(stmt)
    following = block[block.index(stmt) + 1]
    kept: list[cst.EmptyLine] = []

    def drop(removed: cst.BaseStatement) -> list[cst.BaseStatement]:
        kept.extend(getattr(removed, "leading_lines", ()))
        return []

    def take_comments(after: cst.BaseStatement) -> list[cst.BaseStatement]:
        return [after.with_changes(leading_lines=[*kept, *after.leading_lines])]  # type: ignore[attr-defined]

    transform.rewrite_statement(stmt, drop)
    transform.rewrite_statement(following, take_comments)


def mean_of(node: cst.CSTNode) -> cst.Call:
    """`<node>.mean()`."""
    return cst.Call(func=cst.Attribute(value=node, attr=cst.Name("mean")))  # type: ignore[arg-type]
