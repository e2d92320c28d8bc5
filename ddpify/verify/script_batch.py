"""Find where a script sets its training loader's batch, read statically (see plan.ScriptBatch).

Two places verify can set honestly: a module-level constant bound once to an integer literal
(`batch_size = 100`, the loader's `batch_size=batch_size`), and an argparse option read as an
attribute (`batch_size=opt.batch_size`, `parser.add_argument("--batch_size", type=int, default=8)`),
its value from the script's arguments or its default. Anything else (a literal in the call, a value
computed or rebound) is not set: the reference then keeps verify's re-cut, and says where it failed.
"""

from __future__ import annotations

import ast
import os

from ddpify.verify.plan import ScriptBatch


def script_batch(script: str, args: tuple[str, ...]) -> ScriptBatch | None:
    """Where `script` (run with `args`) sets the batch of a loader its training loop iterates, or None."""
    from ddpify.anatomy import analyze

    try:
        source = open(script).read()
        tree, anatomy = ast.parse(source), analyze(source, script)
    except Exception:  # a script the analysis cannot read: nothing to set
        return None
    name = os.path.basename(script)
    for loader in anatomy.loaders:
        size = _batch_argument(loader.call) if loader.is_train and loader.call is not None else None
        found = _constant(tree, size, name) or _option(tree, size, args, name)
        if found:
            return found
    return None


def _batch_argument(call: ast.Call) -> ast.expr | None:
    """DataLoader(dataset, batch_size, ...)'s batch size expression."""
    keyword = next((kw.value for kw in call.keywords if kw.arg == "batch_size"), None)
    return keyword if keyword is not None else (call.args[1] if len(call.args) > 1 else None)


def _constant(tree: ast.Module, size: ast.expr | None, name: str) -> ScriptBatch | None:
    """`batch_size = 100` at module level, the one binding of that name anywhere in the script."""
    if not isinstance(size, ast.Name) or _bindings(tree, size.id) != 1:
        return None
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and _binds(statement, size.id) and _is_int(statement.value):
            literal = statement.value
            return ScriptBatch(f"`{ast.unparse(statement)}` at {name}:{statement.lineno}", literal.value, literal.lineno,
                               literal.col_offset, literal.end_col_offset)
    return None


def _bindings(tree: ast.Module, name: str) -> int:
    """How many times the script binds `name` (assignments, loop targets, parameters, imports)."""
    stores = sum(isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store) for node in ast.walk(tree))
    parameters = sum(isinstance(node, ast.arg) and node.arg == name for node in ast.walk(tree))
    imports = sum(isinstance(node, ast.alias) and (node.asname or node.name) == name for node in ast.walk(tree))
    return stores + parameters + imports


def _binds(statement: ast.Assign | ast.AnnAssign, name: str) -> bool:
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    return len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == name


def _is_int(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _option(tree: ast.Module, size: ast.expr | None, args: tuple[str, ...], name: str) -> ScriptBatch | None:
    """`opt.batch_size` from `add_argument("--batch_size", type=int, default=8)`: the value in `args`, or the default."""
    if not (isinstance(size, ast.Attribute) and isinstance(size.value, ast.Name)):
        return None
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
            continue
        options = [arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        keywords = {kw.arg: kw.value for kw in call.keywords}
        if _destination(options, keywords) != size.attr or not _integer_option(keywords):
            continue
        value = _given(args, options)
        default = keywords.get("default")
        if value is None and _is_int(default):
            value = default.value
        if value is not None:
            return ScriptBatch(f"`{options[0]}` ({name}:{call.lineno})", value, option=options[0])
    return None


def _destination(options: list[str], keywords: dict[str, ast.expr]) -> str | None:
    """argparse's `dest` for these option strings: `dest=`, else the first long option, else the first."""
    dest = keywords.get("dest")
    if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
        return dest.value
    flags = [option for option in options if option.startswith("-")]
    long = next((option for option in flags if option.startswith("--")), flags[0] if flags else None)
    return long.lstrip("-").replace("-", "_") if long else None


def _integer_option(keywords: dict[str, ast.expr]) -> bool:
    kind = keywords.get("type")
    return isinstance(kind, ast.Name) and kind.id == "int" and "nargs" not in keywords and "action" not in keywords


def _given(args: tuple[str, ...], options: list[str]) -> int | None:
    """The option's integer value in `args` (the last one given, as argparse takes), or None."""
    value = None
    for i, arg in enumerate(args):
        text = args[i + 1] if arg in options and i + 1 < len(args) else arg.partition("=")[2] if arg.partition("=")[0] in options else None
        if text is not None and text.lstrip("-").isdigit():
            value = int(text)
    return value
