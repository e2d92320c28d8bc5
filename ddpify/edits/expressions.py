"""Expression-level CST builders: parse an expression, the CST type that spells an ast expression,
a keyword added to or removed from a call, and the small rewrites a transform and a lint fix share."""

from __future__ import annotations

import ast

import libcst as cst


_CST_TYPES: dict[type, type] = {
    ast.Name: cst.Name, ast.Attribute: cst.Attribute, ast.Call: cst.Call, ast.Subscript: cst.Subscript,
    ast.BinOp: cst.BinaryOperation, ast.BoolOp: cst.BooleanOperation, ast.UnaryOp: cst.UnaryOperation,
    ast.Compare: cst.Comparison, ast.IfExp: cst.IfExp, ast.ListComp: cst.ListComp, ast.JoinedStr: cst.FormattedString,
    ast.SetComp: cst.SetComp, ast.DictComp: cst.DictComp,
}


_CONSTANT_TYPES: dict[type, type] = {str: cst.SimpleString, int: cst.Integer, float: cst.Float, bool: cst.Name, type(None): cst.Name}


def cst_type_of(node: ast.AST) -> type | None:
    """The LibCST type of the node that spells the ast expression `node` (an edit is keyed by span
    and type); None where no one type does."""
    if isinstance(node, ast.Constant):
        return _CONSTANT_TYPES.get(type(node.value))
    return _CST_TYPES.get(type(node))


def parse_expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def add_keyword(node: cst.CSTNode, keyword: str, value: str) -> cst.CSTNode:
    """The call with `keyword=value` appended, keeping its layout (and any trailing comma)."""
    assert isinstance(node, cst.Call)
    new = cst.Arg(keyword=cst.Name(keyword), value=parse_expr(value),
                  equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
    if not node.args:
        return node.with_changes(args=[new])
    args = list(node.args)
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # trailing comma: keep the call's own layout
        separator = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(whitespace_after=node.whitespace_before_args)
        args[-1] = last.with_changes(comma=separator)
        return node.with_changes(args=[*args, new.with_changes(comma=last.comma)])
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return node.with_changes(args=[*args, new])


def remove_keyword(node: cst.CSTNode, keyword: str) -> cst.CSTNode:
    """The call without its `keyword=` argument, keeping its layout (a last argument's trailing
    comma, or its absence, passes to the argument before it)."""
    assert isinstance(node, cst.Call)
    args = list(node.args)
    index = next(i for i, arg in enumerate(args) if arg.keyword is not None and arg.keyword.value == keyword)
    removed = args.pop(index)
    if index == len(args) and args:
        args[-1] = args[-1].with_changes(comma=removed.comma)
    return node.with_changes(args=args)


def module_of(node: cst.CSTNode) -> cst.CSTNode:
    """`model` -> `model.module`: the model inside its wrapper."""
    return cst.Attribute(value=node, attr=cst.Name("module"))  # type: ignore[arg-type]


def mean_of(node: cst.CSTNode) -> cst.Call:
    """`<node>.mean()`."""
    return cst.Call(func=cst.Attribute(value=node, attr=cst.Name("mean")))  # type: ignore[arg-type]


def cuda_to(call: cst.BaseExpression, device: str) -> cst.Call:
    """`t.cuda(0, non_blocking=True)` -> `t.to(x.device, non_blocking=True)`."""
    assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
    keywords = [a for a in call.args if a.keyword is not None and a.keyword.value != "device"]
    return call.with_changes(func=call.func.with_changes(attr=cst.Name("to")), args=[cst.Arg(parse_expr(device)), *keywords])


def sync_batchnorm_of(module: cst.BaseExpression, convert: str) -> cst.Call:
    """`<convert>(module)`: the module with its BatchNorm layers made SyncBatchNorm (`convert`
    spells `SyncBatchNorm.convert_sync_batchnorm`)."""
    return cst.Call(func=parse_expr(convert), args=[cst.Arg(module)])


SEEDED_GENERATOR = "Generator().manual_seed(0)"


def with_seeded_generator(call: cst.Call, torch: str) -> cst.Call:
    """`random_split(...)` with `generator=<torch>.Generator().manual_seed(0)`, keeping the call's layout."""
    return add_keyword(call, "generator", f"{torch}.{SEEDED_GENERATOR}")  # type: ignore[return-value]
