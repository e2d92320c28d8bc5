"""Reinforcement learning: training data that an environment plays out, episode by episode.

A script that builds an environment (`env = gym.make(...)`, or a class of its own with `reset` and
`step` methods) and trains a network on what it plays
(REINFORCE, actor-critic, DQN with a replay buffer) has no data to shard: each rank plays its own
episodes instead, from an environment seeded with the rank. Episodes end at different steps on
different ranks, so DDP (one all_reduce per backward; per step for an optimizer its class owns, whose
gradients are averaged by hand: ddpify.anatomy.owned_optimizers) hangs unless every rank makes the
same number of optimizer steps. `episode_schedule` reads the loops and tests around each backward: a test that
decides whether a rank steps (`if memory.size() > 2000: train()`) or leaves the loop (`if
running_reward > threshold: break`) can be agreed over the ranks; a step inside the loop over one
episode's environment steps, or under a loop that a rank's own data ends, can't.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ddpify.anatomy.owned_optimizers import owned_optimizers
from ddpify.anatomy.script import Anatomy
from ddpify.anatomy.sites import MODULE_SCOPE, CallSite
from ddpify.anatomy.syntax import ancestors, enclosing_function, identifier, keyword, method_name
from ddpify.anatomy.tree import walk_body

ENVIRONMENT_FACTORIES = ("gym.make", "gymnasium.make", "gym.vector.make", "gymnasium.vector.make")
ENVIRONMENT_STEP = "step"
_SEED_METHODS = ("reset", "seed")
# processes of their own that train (A3C's workers): the script is already parallel
WORKER_PROCESSES = ("torch.multiprocessing.Process", "multiprocessing.Process")
# loops whose count of passes every rank shares when their arguments do
_COUNTED_ITERABLES = ("range", "itertools.count")
_LOOPS = (ast.For, ast.While)
_EXITS = (ast.Break, ast.Continue, ast.Return)
_CALL_DEPTH = 4  # functions followed from a backward up to the loop that calls it
_UNFOLLOWED = ast.Pass()  # heads a path whose function's callers were not found


@dataclass(frozen=True)
class EpisodeSchedule:
    """The tests the ranks must agree on so that each makes the same optimizer steps, or why they can't."""

    every: tuple[ast.expr, ...]  # steps (or keeps looping) only where the test holds on every rank
    any: tuple[ast.expr, ...]  # leaves a loop (or skips a pass) where the test holds on any rank
    uneven: tuple[tuple[int, str], ...]  # (line, why) a rank may step a different number of times


def environments(a: Anatomy) -> list[CallSite]:
    """`gym.make(...)` and the like, and a class of this file that has `reset` and `step` methods built."""
    methods = {scope.rpartition(".") for scope in a.functions}
    built_here = {cls for cls, _, name in methods if name == "reset" and (cls, ".", ENVIRONMENT_STEP) in methods}
    return a.calls_to(*ENVIRONMENT_FACTORIES, *built_here)


def trains_on_environment(a: Anatomy) -> bool:
    """Does the script train on what an environment it builds plays (and on no DataLoader)?"""
    return a.trains and not a.train_loaders and bool(environments(a)) and bool(_environment_steps(a))


def worker_processes(a: Anatomy) -> list[CallSite]:
    """`mp.Process(target=train, ...)`: workers that train on their own (A3C). A target of this file
    that trains nothing (A2C's workers only step an environment for one learner) is not one."""
    return [site for site in a.calls_to(*WORKER_PROCESSES) if _target_may_train(a, site.node)]  # type: ignore[arg-type]


def _target_may_train(a: Anatomy, process: ast.Call) -> bool:
    """Does the process's `target=` train (a backward or an optimizer step, in it or what it calls), or is it unknown?"""
    target = keyword(process, "target")
    name = identifier(target.value) if target is not None else None
    if name not in a.functions:
        return True
    return a.function_contains(name, lambda node: isinstance(node, ast.Call) and a.is_training_call(node))  # type: ignore[arg-type]


def environment_seeds(a: Anatomy) -> list[ast.expr]:
    """The seeds handed to an environment: `env.reset(seed=s)`, `env.seed(s)`, `env.action_space.seed(s)`."""
    names = _environment_names(a)
    seeds: list[ast.expr] = []
    for call in (c.node for c in a.calls if method_name(c.node) in _SEED_METHODS):
        if not _on_environment(call.func.value, names):  # type: ignore[attr-defined]
            continue
        seed = keyword(call, "seed")
        value = seed.value if seed is not None else (call.args[0] if method_name(call) == "seed" and call.args else None)
        if value is not None and not (isinstance(value, ast.Constant) and value.value is None):
            seeds.append(value)
    return seeds


def episode_schedule(a: Anatomy) -> EpisodeSchedule:
    """What each backward's loops and tests need for every rank to step alike (see the module's doc)."""
    every: list[ast.expr] = []
    anys: list[ast.expr] = []
    uneven: list[tuple[int, str]] = []
    for exchange in _gradient_exchanges(a):
        for path in _control_paths(a, exchange, _CALL_DEPTH):
            _read_path(a, path, exchange.lineno, every, anys, uneven)
    uneven += [(m.line, f"{m.target.name} has BatchNorm, whose buffers DDP broadcasts at every forward, and the ranks "
                        "call forward a different number of times") for m in a.trained_models if m.has_batchnorm]
    leaving = [test for test in anys if test not in every]  # a test agreed once: on every rank, then
    return EpisodeSchedule(tuple(dict.fromkeys(every)), tuple(dict.fromkeys(leaving)), tuple(dict.fromkeys(uneven)))


def _gradient_exchanges(a: Anatomy) -> list[ast.Call]:
    """Where the ranks exchange gradients: each step of an optimizer its class owns (averaged by hand
    there), and each backward, through a DDP wrapper, unless every optimizer is one a class owns."""
    owned = owned_optimizers(a)
    steps = [step for optimizer in owned for step in optimizer.steps]
    if owned and len(owned) == len(a.optimizers):
        return steps
    return [site.node for site in a.training_calls if method_name(site.node) == "backward"] + steps  # type: ignore[misc]


def _read_path(a: Anatomy, path: list[ast.stmt], line: int, every: list, anys: list, uneven: list) -> None:
    """Sort the loops and ifs around one backward (outermost first) into tests to agree on, or refusals."""
    if path and path[0] is _UNFOLLOWED:
        uneven.append((line, "the function that steps is called from where ddpify can't follow (a method of an object?), "
                             "so its loops are unknown"))
        return
    loops = [node for node in path if isinstance(node, _LOOPS)]
    if not loops:
        uneven.append((line, "the optimizer step is in no loop over episodes"))
        return
    counters = {n.id for loop in loops if isinstance(loop, ast.For) for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    outer = loops[0]
    for node in path:
        if isinstance(node, _LOOPS) and node is not outer and _plays_steps(a, node) and _ends_on_data(a, node, outer, counters):
            uneven.append((node.lineno, "it runs inside the loop over an episode's environment steps, which ends when the "
                                        "episode does"))
        elif isinstance(node, ast.For) and not _counted(a, node.iter, outer, counters):
            uneven.append((node.lineno, f"the loop over {ast.unparse(node.iter)} may run a different number of times on each rank"))
        elif isinstance(node, ast.While) and not _invariant(a, node.test, outer, counters):
            every.append(node.test)
        elif isinstance(node, ast.If) and not _invariant(a, node.test, outer, counters):
            every.append(node.test)
        if isinstance(node, _LOOPS):
            _read_exits(a, node, outer, counters, anys, uneven)


def _read_exits(a: Anatomy, loop: ast.stmt, outer: ast.stmt, counters: set[str], anys: list, uneven: list) -> None:
    """The tests of a loop's `break`, `continue` and `return` (not a nested loop's): agreed by any rank."""
    for exit_ in (n for n in _own_body(loop) if isinstance(n, _EXITS)):
        for parent, child in ancestors(a, exit_):
            if parent is loop:
                break
            if not isinstance(parent, ast.If) or _invariant(a, parent.test, outer, counters):
                continue
            if child in parent.orelse:
                uneven.append((parent.lineno, f"the ranks leave the loop on line {loop.lineno} in an else branch"))
            else:
                anys.append(parent.test)


def _own_body(loop: ast.stmt) -> list[ast.AST]:
    """The nodes of a loop's body, not those of the loops, functions or classes nested in it."""
    found, stack = [], list(loop.body)  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, (*_LOOPS, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack += list(ast.iter_child_nodes(node))
    return found


def _control_paths(a: Anatomy, node: ast.AST, depth: int) -> list[list[ast.stmt]]:
    """The loops and ifs around `node`, outermost first, through the calls of its function (one list per caller)."""
    scope = enclosing_function(a, node)
    inside = [parent for parent, _ in ancestors(a, node) if isinstance(parent, (*_LOOPS, ast.If))
              and parent is not a.main_guard and enclosing_function(a, parent) == scope][::-1]
    if scope == MODULE_SCOPE:
        return [inside]
    callers = [c for c in a.calls if a.callee(c.node) == scope or _calls_method_of_instance(a, c.node, scope)]  # type: ignore[arg-type]
    if not callers or depth == 0:
        return [[_UNFOLLOWED, *inside]]
    return [outer + inside for caller in callers for outer in _control_paths(a, caller.node, depth - 1)]


def _calls_method_of_instance(a: Anatomy, call: ast.Call, scope: str) -> bool:
    """`agent.learn()` where `agent = Agent(...)` and `scope` is `Agent.learn`."""
    cls, _, method = scope.rpartition(".")
    if not cls or method_name(call) != method:
        return False
    receiver = identifier(call.func.value)  # type: ignore[attr-defined]
    return any(receiver in _names_bound_to(site) for site in a.calls_to(cls))


def _names_bound_to(site: CallSite) -> set[str | None]:
    """The names a call's value is assigned to: `agent = Agent()`, or its item of `q1, q2 = QNet(), QNet()`."""
    stmt = site.stmt
    if not isinstance(stmt, ast.Assign):
        return set()
    if stmt.value is site.node:
        return {identifier(t) for t in stmt.targets}
    pairs = [zip(t.elts, stmt.value.elts) for t in stmt.targets
             if isinstance(t, ast.Tuple) and isinstance(stmt.value, ast.Tuple) and len(t.elts) == len(stmt.value.elts)]
    return {identifier(target) for pair in pairs for target, value in pair if value is site.node}


def _invariant(a: Anatomy, expr: ast.expr, outer: ast.stmt, counters: set[str]) -> bool:
    """Is the test alike on every rank: calls nothing, reads only loop counters and names no pass assigns?"""
    if any(isinstance(n, (ast.Call, ast.Await, ast.NamedExpr)) for n in ast.walk(expr)):
        return False
    assigned = _assigned_in(outer)
    return all(n.id in counters or n.id not in assigned for n in ast.walk(expr) if isinstance(n, ast.Name))


def _counted(a: Anatomy, iterable: ast.expr, outer: ast.stmt, counters: set[str]) -> bool:
    """`range(n)`, `count(1)`, `enumerate(range(n))` whose arguments every rank shares."""
    if not isinstance(iterable, ast.Call):
        return False
    if a.qualname(iterable.func) == "enumerate" and iterable.args:
        return _counted(a, iterable.args[0], outer, counters)
    return a.qualname(iterable.func) in _COUNTED_ITERABLES and all(_invariant(a, arg, outer, counters) for arg in iterable.args)


def _assigned_in(loop: ast.stmt) -> set[str]:
    return {n.id for n in walk_body([loop]) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _plays_steps(a: Anatomy, loop: ast.stmt) -> bool:
    """Does a pass of the loop take environment steps (in the loops nested in it too)?"""
    names = _environment_names(a)
    return any(method_name(n) == ENVIRONMENT_STEP and _on_environment(n.func.value, names)  # type: ignore[attr-defined]
               for n in walk_body(loop.body))  # type: ignore[attr-defined]


def _ends_on_data(a: Anatomy, loop: ast.stmt, outer: ast.stmt, counters: set[str]) -> bool:
    """Does the loop end on what the episode does (a `while` on its test, a break, a return)?"""
    if isinstance(loop, ast.While) and not _invariant(a, loop.test, outer, counters):
        return True
    return any(isinstance(n, _EXITS) for n in _own_body(loop))


def _environment_steps(a: Anatomy) -> list[ast.Call]:
    names = _environment_names(a)
    return [c.node for c in a.calls if method_name(c.node) == ENVIRONMENT_STEP and _on_environment(c.node.func.value, names)]  # type: ignore[attr-defined]


def _environment_names(a: Anatomy) -> set[str]:
    """The variables an environment is assigned to (`env`, `self.env`)."""
    names = set()
    for site in environments(a):
        if isinstance(site.stmt, ast.Assign) and site.stmt.value is site.node:
            names |= {identifier(t) for t in site.stmt.targets if identifier(t)}
    return names


def _on_environment(receiver: ast.expr, names: set[str]) -> bool:
    """`env` or `env.action_space` (one attribute down)."""
    return identifier(receiver) in names or (isinstance(receiver, ast.Attribute) and identifier(receiver.value) in names)
