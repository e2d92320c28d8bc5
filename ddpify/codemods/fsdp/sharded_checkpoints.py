"""Sharded checkpoints (`convert --to fsdp --checkpoint sharded`): every rank writes its own shards
with torch.distributed.checkpoint (DCP); nothing is gathered.

`torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)`
of a sharded model becomes `dcp.save({"model": get_model_state_dict(model), "optimizer":
get_optimizer_state_dict(model, optimizer), "epoch": epoch}, checkpoint_id=path)` on every rank (a
collective: no rank-0 guard). `path` itself names the checkpoint's directory (a `.distcp` file per
rank and a `.metadata`), so the script's `os.path.exists(path)` still finds it.

`ckpt = torch.load(path)` of the same path becomes the saved dict as a template (the sharded state
of the model and optimizer; None for the other entries, which DCP fills in) and `dcp.load(ckpt,
checkpoint_id=path)`; `model.load_state_dict(ckpt[...])` becomes `set_model_state_dict(...)`.
A bare `torch.save(model.state_dict(), path)` is saved the same way (the state dict is the whole
checkpoint), and `model.load_state_dict(torch.load(path))` loads it back in three statements.

A checkpoint this cannot rewrite whole stays full (FullStateDicts gathers it) and is reported: a
payload that is not a dict literal of the save (built elsewhere, or saved by a helper), an entry
that is itself a container (DCP flattens it, and a template cannot name its keys), a save under a
rank test, a load of the same path other than `name = torch.load(path)` (or, for a bare state dict,
`model.load_state_dict(torch.load(path))`) in the save's function, into the object saved.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

import libcst as cst

from ddpify.anatomy import ROLE_MODEL, ROLE_OPTIMIZER, Anatomy
from ddpify.anatomy.distributed.fsdp import after_shard
from ddpify.anatomy.distributed.names import DCP_MODULE
from ddpify.anatomy.distributed.ranks import rank_guarded
from ddpify.anatomy.distributed.reaching import reaching_values
from ddpify.anatomy.syntax import argument, contains, method_name
from ddpify.anatomy.vocabulary import TORCH_LOAD, TORCH_SAVE
from ddpify.codemods.fsdp.state_dicts import STATE_DICT_MODULE, CollectiveStateDicts
from ddpify.codemods.options import Options
from ddpify.edits.expressions import parse_expr
from ddpify.edits.statements import parse_statements

CONTAINER_NODES = (ast.Dict, ast.List, ast.Tuple, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
CONTAINER_CALLS = frozenset({"dict", "list", "tuple", "set", "vars", "collections.OrderedDict"})
LOADED = "loaded_state"  # the template a bare state dict is loaded into


@dataclass(frozen=True)
class Entry:
    """One `"key": value` of a saved dict (key None: the state dict saved bare)."""

    key: str | None
    value: ast.expr
    state: str | None = None  # "model" or "optimizer": a state dict of the sharded model; None: any other value
    owner: str = ""  # the arguments get_/set_<state>_state_dict take: `model` or `model, optimizer`
    obj: str = ""  # the model or optimizer whose state it is

    @property
    def gather(self) -> str:
        return f"get_{self.state}_state_dict({self.owner})"


@dataclass(frozen=True)
class Save:
    call: ast.Call
    path: ast.expr
    entries: tuple[Entry, ...]

    @property
    def bare(self) -> bool:
        return self.entries[0].key is None

    def template(self) -> str:
        """What dcp.load reads into: the saved layout, with the sharded state and None for other values."""
        if self.bare:
            return self.entries[0].gather
        return "{" + ", ".join(f"{json.dumps(e.key)}: {e.gather if e.state else 'None'}" for e in self.entries) + "}"


class ShardedCheckpoints(CollectiveStateDicts):
    """Sharded DCP checkpoints of sharded models: every rank saves and loads its own shards."""

    NAME = "checkpoint"

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        return options.checkpoint == "sharded"

    def plan(self) -> None:
        sharded = self.sharded_models() if self.options.checkpoint == "sharded" else set()
        if not sharded:
            return
        saves: dict[str, list[Save]] = {}
        for site in self.anatomy.calls_to(TORCH_SAVE):
            call: ast.Call = site.node  # type: ignore[assignment]
            if not after_shard(self.anatomy, call) or not self._saves_sharded_state(argument(call, 0, "obj"), sharded):
                continue
            found = self._sharded_save(call, sharded)
            if isinstance(found, str):
                self._keep_full(call.lineno, found)
            else:
                saves.setdefault(ast.dump(found.path), []).append(found)
        loads = [c.node for c in self.anatomy.calls_to(TORCH_LOAD) if after_shard(self.anatomy, c.node)]
        read = [self._rewrite_checkpoint(group, [c for c in loads if _loaded_path(c) == path]) for path, group in saves.items()]
        if any(read):
            self._advise_other_loads([c for c in loads if _loaded_path(c) not in saves])  # type: ignore[arg-type]
        self.follow_rank_zero_decisions()

    def _advise_other_loads(self, loads: list[ast.Call]) -> None:
        """A torch.load of another path may still read one of the directories now saved sharded."""
        for call in loads:
            self.advise(call.lineno, "--checkpoint sharded: this torch.load reads a full checkpoint file; if it reads one this "
                                     "script now saves with dcp.save (a directory), load it with dcp.load and set_model_state_dict")

    # ----- what can be saved sharded ----------------------------------------------------------
    def _saves_sharded_state(self, payload: ast.AST | None, sharded: set, depth: int = 0) -> bool:
        """Does the saved object hold a state dict of a sharded model or of an optimizer (through
        variables and a helper's parameters, two assignments deep)?"""
        if payload is None or depth > 2:
            return False
        for node in ast.walk(payload):
            if method_name(node) == "state_dict" and self._state_of(node.func.value, sharded):  # type: ignore[attr-defined]
                return True
            if isinstance(node, ast.Name) and any(self._saves_sharded_state(v, sharded, depth + 1) for v in reaching_values(self.anatomy, node)):
                return True
        return False

    def _state_of(self, owner: ast.expr, sharded: set) -> str | None:
        if self.anatomy.origins(owner, ROLE_MODEL) & sharded:
            return "model"
        return "optimizer" if self.anatomy.has_role(owner, ROLE_OPTIMIZER) else None

    def _sharded_save(self, call: ast.Call, sharded: set) -> Save | str:
        """The save, rewritable as dcp.save, or why it is not."""
        stmt = self.anatomy.stmt_of.get(call)
        if not (isinstance(stmt, ast.Expr) and stmt.value is call):
            return "the save is part of a larger statement"
        path, payload = argument(call, 1, "f"), argument(call, 0, "obj")
        if path is None or len(call.args) + len(call.keywords) != 2:
            return "torch.save has arguments besides the object and the path"
        if rank_guarded(self.anatomy, call):
            return "it runs on some ranks only, and dcp.save needs every rank"
        if not isinstance(payload, ast.Dict):
            bare = self._entry(None, payload, sharded) if payload is not None else None
            if isinstance(bare, Entry) and bare.state:
                return Save(call, path, (bare,))
            return "what it saves is neither a state dict nor a dict written in the torch.save call, so the layout that dcp.load needs is not known here"
        entries = []
        for key, value in zip(payload.keys, payload.values):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                return "a key of the saved dict is not a string literal"
            entry = self._entry(key.value, value, sharded)
            if isinstance(entry, str):
                return entry
            entries.append(entry)
        return Save(call, path, tuple(entries))  # type: ignore[arg-type]

    def _entry(self, key: str | None, value: ast.expr, sharded: set) -> Entry | str:
        if method_name(value) == "state_dict" and not (value.args or value.keywords):  # type: ignore[attr-defined]
            owner = value.func.value  # type: ignore[attr-defined]
            state = self._state_of(owner, sharded)
            if state == "model":
                return Entry(key, value, state, ast.unparse(owner), ast.unparse(owner))
            roots = self.shard_roots()
            if state == "optimizer" and len(roots) == 1:
                return Entry(key, value, state, f"{roots.pop()}, {ast.unparse(owner)}", ast.unparse(owner))
            if state == "optimizer":
                return f"the optimizer saved as {key!r} trains one of several sharded models"
        if contains(value, lambda n: method_name(n) == "state_dict"):
            return f"{key!r} holds a state dict that is not the sharded model's or its optimizer's"
        if self._may_be_container(value):
            return f"{key!r} may hold a dict or a list, which DCP flattens into keys that a load template cannot name"
        return Entry(key, value)

    def _may_be_container(self, value: ast.expr) -> bool:
        values = reaching_values(self.anatomy, value) if isinstance(value, (ast.Name, ast.Attribute)) else [value]
        return any(isinstance(v, CONTAINER_NODES) or (isinstance(v, ast.Call) and self.anatomy.qualname(v.func) in CONTAINER_CALLS)
                   for v in values)

    # ----- what can be loaded back ------------------------------------------------------------
    def _rewrite_checkpoint(self, saves: list[Save], loads: list[ast.Call]) -> bool:
        """Saves of one path and the loads that read it go sharded together, or all stay full (False)."""
        layouts = {tuple(e.key for e in save.entries) for save in saves}
        problems = [f"{ast.unparse(load)} reads it back in a way dcp.load cannot follow: {why}"
                    for load in loads if (why := self._load_problem(load, saves[0]))]
        if len(layouts) > 1:
            problems.append("the saves of this path store different keys")
        for save in saves:
            if problems:
                self._keep_full(save.call.lineno, problems[0])
            else:
                self._save_sharded(save)
        for load in loads if not problems else ():
            self._load_sharded(load, saves[0])
        return not problems

    def _load_problem(self, call: ast.Call, save: Save) -> str:
        stmt = self.anatomy.stmt_of.get(call)
        inline = save.bare and self._loaded_inline(call)
        if not inline and not (isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            return "it is not `name = torch.load(path)`" + (" nor `model.load_state_dict(torch.load(path))`" if save.bare else "")
        if self.anatomy.scope_of.get(call) != self.anatomy.scope_of.get(save.call):
            return "it is loaded in another function than the one that saves it"
        if not after_shard(self.anatomy, call):
            return "it is loaded before fully_shard"
        for use in [inline] if inline else self._state_loads(stmt):  # type: ignore[arg-type, list-item]
            if len(use.args) + len(use.keywords) != 1 or (self._entry_read(use, save) is None):
                return f"{ast.unparse(use)} does not load one saved state into the object it was saved from"
        return ""

    def _loaded_inline(self, call: ast.Call) -> ast.Call | None:
        """The `x.load_state_dict(torch.load(path))` statement's call, when `call` is that torch.load."""
        use = self.anatomy.parents.get(call)
        stmt = self.anatomy.stmt_of.get(call)
        if method_name(use) == "load_state_dict" and isinstance(stmt, ast.Expr) and stmt.value is use and use.args == [call]:  # type: ignore[union-attr]
            return use  # type: ignore[return-value]
        return None

    def _entry_read(self, use: ast.Call, save: Save) -> Entry | None:
        """The saved entry `x.load_state_dict(arg)` loads (ckpt["model"], or the whole bare state), if into its own object."""
        arg = use.args[0]
        if save.bare:
            entry: Entry | None = save.entries[0]
        else:
            key = arg.slice if isinstance(arg, ast.Subscript) else None
            entry = next((e for e in save.entries if e.state and isinstance(key, ast.Constant) and e.key == key.value), None)
        return entry if entry is not None and ast.unparse(use.func.value) == entry.obj else None  # type: ignore[attr-defined]

    def _state_loads(self, stmt: ast.Assign) -> list[ast.Call]:
        """The `x.load_state_dict(...)` calls that read the variable `stmt` loads into."""
        name = stmt.targets[0].id  # type: ignore[attr-defined]
        scope = self.anatomy.scope_of.get(stmt)
        return [c.node for c in self.anatomy.calls if method_name(c.node) == "load_state_dict" and c.scope == scope  # type: ignore[misc]
                and c.line > stmt.lineno and contains(c.node, lambda n: isinstance(n, ast.Name) and n.id == name)]

    # ----- the rewrites -------------------------------------------------------------------------
    def _save_sharded(self, save: Save) -> None:
        self.add_import(DCP_MODULE, asname="dcp")
        for entry in save.entries:
            if entry.state:
                self.add_import(STATE_DICT_MODULE, f"get_{entry.state}_state_dict")
                self.rewrite_node(entry.value, cst.Call, lambda _node, e=entry: parse_expr(e.gather))
        self.rewrite_node(save.call, cst.Call, _dcp_save)
        self.changed(save.call.lineno, f"torch.save -> dcp.save(..., checkpoint_id={ast.unparse(save.path)}) on every rank: "
                                       "a directory of this path's name, each rank writing its shards (.distcp)")
        self.collective_at(save.call)

    def _load_sharded(self, call: ast.Call, save: Save) -> None:
        stmt = self.anatomy.stmt_of[call]
        path = ast.get_source_segment(self.anatomy.text, argument(call, 0, "f"))  # type: ignore[arg-type]
        inline = self._loaded_inline(call) if save.bare else None
        name = LOADED if inline else stmt.targets[0].id  # type: ignore[attr-defined]
        load = (f"{name} = {save.template()}  # dcp.load fills this in place with the saved state\n"
                f"dcp.load({name}, checkpoint_id={path})\n")
        if inline:
            entry = save.entries[0]
            self.add_import(STATE_DICT_MODULE, f"set_{entry.state}_state_dict")
            load += f"set_{entry.state}_state_dict({entry.owner}, {name})\n"
        self.rewrite_statement(stmt, lambda _stmt: parse_statements(load))
        self.changed(call.lineno, f"torch.load({path}) -> dcp.load into the layout dcp.save writes (every rank reads its shards)")
        for use in [] if inline else self._state_loads(stmt):  # type: ignore[arg-type]
            entry = self._entry_read(use, save)
            self.add_import(STATE_DICT_MODULE, f"set_{entry.state}_state_dict")  # type: ignore[union-attr]
            self.rewrite_node(use, cst.Call, lambda node, e=entry: parse_expr(
                f"set_{e.state}_state_dict({e.owner}, {cst.Module([]).code_for_node(node.args[0].value)})"))  # type: ignore[attr-defined]
            self.changed(use.lineno, f"{ast.unparse(use.func)} -> set_{entry.state}_state_dict (the sharded state dcp.load read)")  # type: ignore[union-attr]

    def _keep_full(self, line: int, why: str) -> None:
        self.advise(line, f"--checkpoint sharded: this checkpoint stays full (gathered on every rank, written by rank 0): {why}")


def _loaded_path(load: ast.Call) -> str | None:
    """The path a torch.load reads, comparable with a Save's path (ast.dump)."""
    path = argument(load, 0, "f")
    return ast.dump(path) if path is not None else None


def _dcp_save(node: cst.CSTNode) -> cst.CSTNode:
    """`torch.save(obj, path)` -> `dcp.save(obj, checkpoint_id=path)`, keeping the call's layout."""
    assert isinstance(node, cst.Call)
    payload = next(a for a in node.args if (a.keyword.value == "obj" if a.keyword else a is node.args[0]))
    path = next(a for a in node.args if a is not payload)
    checkpoint_id = path.with_changes(keyword=cst.Name("checkpoint_id"), equal=cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
    first = payload.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
    if payload is not node.args[0]:  # written as torch.save(f=..., obj=...): the payload goes first
        first, checkpoint_id = first.with_changes(comma=path.comma), checkpoint_id.with_changes(comma=payload.comma)
    return node.with_changes(func=parse_expr("dcp.save"), args=[first, checkpoint_id])
