"""Checkpoints of a sharded model: whole state dicts, gathered on every rank, written by rank 0.

After `fully_shard`, `model.state_dict()` holds each rank's shards. Once the model is sharded,
`model.state_dict()` / `optimizer.state_dict()` become `get_model_state_dict` /
`get_optimizer_state_dict` with full, CPU-offloaded state (keys and shapes of the single-GPU
model, so checkpoints load into the original script), and `load_state_dict` becomes
`set_model_state_dict` / `set_optimizer_state_dict`. Gathering is a collective: a gather inside a
statement that rank 0 alone will run (`torch.save(...)`, `with open(..., "wb")`) is hoisted into a
variable just before it, so every rank takes part.
"""

from __future__ import annotations

import ast

import libcst as cst

from ddpify.anatomy import ROLE_MODEL, ROLE_OPTIMIZER, Anatomy, Ref
from ddpify.anatomy.distributed.fsdp import after_shard
from ddpify.anatomy.distributed.names import FULLY_SHARD
from ddpify.anatomy.vocabulary import STATE_DICT_METHODS, TORCH_SAVE, opens_for_writing
from ddpify.codemods.base import Transform
from ddpify.codemods.options import Options
from ddpify.edits.expressions import parse_expr

STATE_DICT_MODULE = "torch.distributed.checkpoint.state_dict"
FULL_STATE = "StateDictOptions(full_state_dict=True, cpu_offload=True)"
# a forward without backward (evaluation) leaves the root's parameters unsharded: loading needs them sharded
RESHARD_WHY = "  # ddpify: parameters an evaluation forward left whole, sharded again\n"
FULL_LOAD = "StateDictOptions(full_state_dict=True)"
RANK0_DECISION = "rank0_decision"


class CollectiveStateDicts(Transform):
    """What the checkpoint transforms share: the sharded models, and rank-local decisions around
    a collective (a gather, a DCP save) that every rank must follow the same way."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._decisions: set[ast.If] = set()

    def sharded_models(self) -> set:
        """The model sites that some `fully_shard(...)` call shards."""
        return {o for s in self.anatomy.calls_to(*FULLY_SHARD) if s.node.args  # type: ignore[attr-defined]
                for o in self.anatomy.origins(s.node.args[0], ROLE_MODEL)}  # type: ignore[attr-defined]

    def shard_roots(self) -> set[str]:
        """The names the script's `fully_shard(...)` calls shard, less the loop over repeated blocks."""
        return {ast.unparse(s.node.args[0]) for s in self.anatomy.calls_to(*FULLY_SHARD) if s.node.args} - {"shard_block"}  # type: ignore[attr-defined]

    def collective_at(self, call: ast.Call) -> None:
        """`call` is a collective: the rank-local `if`s around it will follow rank 0's decision."""
        self._decisions.update(self._rank_local_decisions(call))

    def follow_rank_zero_decisions(self) -> None:
        for decision in sorted(self._decisions, key=lambda branch: branch.lineno):
            self._follow_rank_zero(decision)

    def _rank_local_decisions(self, call: ast.Call) -> list[ast.If]:
        """`if` statements around the gather whose test may differ between ranks (a loss, a metric)."""
        loop_variables = {n.id for loop in self.anatomy.enclosing(call, (ast.For, ast.AsyncFor)) for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        decisions = []
        for branch in self.anatomy.enclosing(call, ast.If):
            names = {n.id for n in ast.walk(branch.test) if isinstance(n, ast.Name)} - {RANK0_DECISION}
            local = {n for n in names if self.anatomy.ref(ast.Name(n), self.anatomy.scope_of.get(call)) in self._function_locals(call)}
            if local - loop_variables and self._is_plain_if(branch):
                decisions.append(branch)
        return decisions

    def _function_locals(self, call: ast.Call) -> set:
        scope = self.anatomy.scope_of.get(call)
        fn = self.anatomy.functions.get(scope or "")
        return {Ref(scope, name) for name in fn.locals} if fn else set()

    def _is_plain_if(self, branch: ast.If) -> bool:
        """An `if` that is a statement of its block (not the `elif` of another)."""
        return branch in self.anatomy.block_of(branch)

    def _follow_rank_zero(self, branch: ast.If) -> None:
        """Every rank takes rank 0's branch, so the collective inside runs on all of them or on none."""
        self.insert_before(branch, f"{RANK0_DECISION} = [{ast.unparse(branch.test)}]\n"
                                   f"dist.broadcast_object_list({RANK0_DECISION}, src=0)  # ranks must agree: a collective below\n")
        self.rewrite_expression(branch.test, lambda _node: parse_expr(f"{RANK0_DECISION}[0]"))
        self.changed(branch.lineno, f"every rank follows rank 0's `if {ast.unparse(branch.test)}` (a collective inside)")


class FullStateDicts(CollectiveStateDicts):
    """Full (unsharded) state dicts of sharded models, gathered on every rank."""

    NAME = "state_dict"

    @classmethod
    def finds_work(cls, anatomy: Anatomy, options: Options) -> bool:
        """Only a state-dict method called can hold shards (the shard adds none)."""
        return any(isinstance(c.node.func, ast.Attribute) and c.node.func.attr in STATE_DICT_METHODS for c in anatomy.calls)  # type: ignore[attr-defined]

    def plan(self) -> None:
        sharded = self.sharded_models()
        if not sharded:
            return
        for call in self.anatomy.calls:
            func = call.node.func  # type: ignore[attr-defined]
            if not (isinstance(func, ast.Attribute) and func.attr in STATE_DICT_METHODS) or not after_shard(self.anatomy, call.node):
                continue
            if self.anatomy.origins(func.value, ROLE_MODEL) & sharded:
                self._to_full_state(call.node, func, "model", ast.unparse(func.value))  # type: ignore[arg-type]
            elif self.anatomy.origins(_root(func.value), ROLE_MODEL) & sharded:
                self.missing(call.line, f"{ast.unparse(func)}() of a part of the sharded model holds this rank's shards (DTensors)",
                             f"gather the whole model's state with get_model_state_dict({ast.unparse(_root(func.value))}, options={FULL_STATE}) "
                             f"on every rank and take that part's keys from it")
            elif self.anatomy.has_role(func.value, ROLE_OPTIMIZER):
                self._rewrite_optimizer(call.node, func, self.shard_roots())  # type: ignore[arg-type]
        self.follow_rank_zero_decisions()

    def _rewrite_optimizer(self, call: ast.Call, func: ast.Attribute, models: set[str]) -> None:
        """The optimizer's state is keyed by the model it trains: name it when there is one."""
        if len(models) != 1:
            self.advise(call.lineno, f"{ast.unparse(func)}(): use get/set_optimizer_state_dict(model, optimizer, ...) with the model this optimizer trains")
            return
        self._to_full_state(call, func, "optimizer", f"{models.pop()}, {ast.unparse(func.value)}")

    def _to_full_state(self, call: ast.Call, func: ast.Attribute, what: str, owner: str) -> None:
        self.add_import(STATE_DICT_MODULE, "StateDictOptions")
        if func.attr == "load_state_dict":
            self.add_import(STATE_DICT_MODULE, f"set_{what}_state_dict")
            self.rewrite_node(call, cst.Call, lambda node: parse_expr(
                f"set_{what}_state_dict({owner}, {_arguments(node)}, options={FULL_LOAD})"))
            if what == "model":
                self.insert_before(self.anatomy.stmt_of[call], f"{owner}.reshard(){RESHARD_WHY}")
            self.changed(call.lineno, f"{ast.unparse(func.value)}.load_state_dict -> set_{what}_state_dict (full state, sharded on load)")
            return
        self.add_import(STATE_DICT_MODULE, f"get_{what}_state_dict")
        gather = f"get_{what}_state_dict({owner}, options={FULL_STATE})"
        guarded = self._statement_rank_zero_will_guard(call)
        if guarded is None:
            self._replace_call(call, gather)
        else:
            variable = f"full_{what}_state"
            self.insert_before(guarded, f"{variable} = {gather}  # a collective: every rank gathers\n")
            self._replace_call(call, variable)
        self.changed(call.lineno, f"{ast.unparse(func.value)}.state_dict() -> {gather.split('(')[0]} (whole, on every rank)")
        self.collective_at(call)

    def _replace_call(self, call: ast.Call, code: str) -> None:
        self.rewrite_node(call, cst.Call, lambda _node: parse_expr(code))

    def _statement_rank_zero_will_guard(self, call: ast.Call) -> ast.stmt | None:
        """The outermost statement around `call` that only rank 0 will run: a save or a file write."""
        stmt = self.anatomy.stmt_of.get(call)
        writes = [w for w in self.anatomy.enclosing(call, (ast.With, ast.AsyncWith))
                  if any(opens_for_writing(self.anatomy, item.context_expr) for item in w.items)]
        if writes:
            return writes[-1]
        saves = [c for c in self.anatomy.calls_to(TORCH_SAVE) if c.stmt is stmt]
        return stmt if saves else None


def _root(expr: ast.expr) -> ast.expr:
    """`net` in `net[0]`, `net.backbone`, `net.blocks[2]`: the object a part is taken from."""
    while isinstance(expr, (ast.Subscript, ast.Attribute)):
        expr = expr.value
    return expr


def _arguments(call: cst.CSTNode) -> str:
    """The call's arguments as the user wrote them."""
    assert isinstance(call, cst.Call)
    return ", ".join(cst.Module([]).code_for_node(arg.value) for arg in call.args)
