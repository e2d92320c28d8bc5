"""FSDP: FSDP2's `fully_shard` calls and the models they shard, code that runs once the model is sharded,
and legacy `FullyShardedDataParallel` with its per-rank state-dict modes.
"""

from __future__ import annotations

import ast

from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.cache import per_anatomy
from ddpify.anatomy.distributed.names import FULLY_SHARD, LEGACY_STATE_DICT_MODES, SHARDED_STATE_DICT_TYPES
from ddpify.anatomy.distributed.reaching import only_called_before, reaching_values
from ddpify.anatomy.distributed.wrappers import model_origins
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite
from ddpify.anatomy.syntax import argument
from ddpify.anatomy.vocabulary import LEGACY_FSDP


@per_anatomy
def shard_calls(a: Anatomy) -> list[CallSite]:
    """Every `fully_shard(module, ...)` call (FSDP2)."""
    return [c for c in a.calls if c.qualname in FULLY_SHARD]


@per_anatomy
def sharded_origins(a: Anatomy) -> set[ast.Call]:
    """The constructor calls of every model that `fully_shard` shards (its root, not its blocks)."""
    found: set[ast.Call] = set()
    for site in shard_calls(a):
        inner = argument(site.node, 0, "module")  # type: ignore[arg-type]
        found |= (model_origins(a, inner) or set()) if inner is not None else set()
    return found


def after_shard(a: Anatomy, node: ast.AST) -> bool:
    """Is `node` reached only once the model is sharded (later in the shard's function, or in a
    function that is not only called before the shard)?"""
    scope = a.scope_of.get(node, MODULE_SCOPE)
    for shard in shard_calls(a):
        if shard.scope == scope:
            return node.lineno > shard.stmt.end_lineno  # type: ignore[attr-defined, operator]
        if not only_called_before(a, scope, shard.stmt):
            return True
    return False


def is_legacy_fsdp(a: Anatomy, expr: ast.AST) -> bool:
    """Does `expr` hold a legacy `FullyShardedDataParallel(...)` wrapper?"""
    values = reaching_values(a, expr) if isinstance(expr, (ast.Name, ast.Attribute)) else [expr]
    return any(isinstance(v, ast.Call) and a.qualname(v.func) == LEGACY_FSDP for v in values)


@per_anatomy
def sharded_legacy_state_dicts(a: Anatomy) -> list[CallSite]:
    """`FSDP.state_dict_type(...)` / `FSDP.set_state_dict_type(...)` calls that pick a per-rank mode."""
    return [
        c for c in a.calls
        if c.qualname in LEGACY_STATE_DICT_MODES
        and any(isinstance(n, ast.Attribute) and n.attr in SHARDED_STATE_DICT_TYPES for n in ast.walk(c.node))
    ]


def in_sharded_legacy_mode(a: Anatomy, node: ast.AST) -> bool:
    """Does `node` run where legacy FSDP's `state_dict()` returns this rank's shards: inside a
    `with FSDP.state_dict_type(m, StateDictType.SHARDED_STATE_DICT)` block, or after a
    `set_state_dict_type` to such a mode in the same function?"""
    modes = sharded_legacy_state_dicts(a)
    for block in a.enclosing(node, (ast.With, ast.AsyncWith)):
        if any(item.context_expr is mode.node for item in block.items for mode in modes):  # type: ignore[attr-defined]
            return True
    scope = a.scope_of.get(node, MODULE_SCOPE)
    return any(
        mode.scope == scope and isinstance(mode.stmt, ast.Expr) and mode.stmt.end_lineno < node.lineno  # type: ignore[attr-defined, operator]
        for mode in modes
    )


def is_sharded_model(a: Anatomy, expr: ast.AST) -> bool:
    """Does `expr` hold a model that `fully_shard` shards somewhere in the script?"""
    return bool(sharded_origins(a) and (model_origins(a, expr) or set()) & sharded_origins(a))
