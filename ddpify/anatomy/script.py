"""`Anatomy`: everything ddpify knows about one script, for the codemods and the lint rules alike.

It is built in layers, each on the one before: `ScriptTree` (ddpify.anatomy.tree: where things stand),
`ScriptValues` (ddpify.anatomy.values: what they hold), `TrainedModels` (ddpify.anatomy.trained_models:
the models trained and where each is bound); this last layer adds the loops that train and the
questions about the whole script. `analyze` (ddpify.anatomy.analyzer) builds one.
"""

from __future__ import annotations

import ast
from functools import cached_property

from ddpify.anatomy.facts import NO_FACTS, ProjectFacts
from ddpify.anatomy.sites import CallSite, LoaderSite, LoopSite, ScriptKind
from ddpify.anatomy.syntax import argument, constant
from ddpify.anatomy.trained_models import TrainedModels
from ddpify.anatomy.values import ROLE_MODEL
from ddpify.anatomy.vocabulary import ACCELERATOR, DDP_WRAPPER, DISTRIBUTING_FRAMEWORKS, DP_WRAPPER


class Anatomy(TrainedModels):
    """Everything ddpify knows about one script. Build it with `analyze(text, path)`."""

    def __init__(self, text: str, path: str, tree: ast.Module, pending_imports: dict[str, str] | None = None,
                 facts: ProjectFacts = NO_FACTS) -> None:
        super().__init__(text, path, tree, pending_imports, facts)
        self.step_loops: list[LoopSite] = []
        self.epoch_loops: list[LoopSite] = []
        self.delegated_steps: list[LoopSite] = []  # calls into another file that iterate a loader of this one
        # `iter(loader)` calls whose batches training draws with next(): each starts a pass over the
        # loader (the call node; the training loop it stands in, when it restarts the pass there)
        self.iterator_passes: list[tuple[ast.Call, LoaderSite, ast.stmt | None]] = []
        self.loader_iters: list[tuple[ast.Call, LoaderSite]] = []  # every `iter(loader)`: a pass of its own

    # ----- the script as a whole -------------------------------------------------------------
    @property
    def kind(self) -> ScriptKind:
        if not self.names.imports("torch"):
            return ScriptKind.NOT_TORCH
        qualnames = {c.qualname for c in self.calls}
        if "torch.multiprocessing.spawn" in qualnames:
            return ScriptKind.SPAWN
        if DDP_WRAPPER in qualnames or "torch.distributed.init_process_group" in qualnames:
            return ScriptKind.DDP
        if self.framework is not None:
            return ScriptKind.ACCELERATE if self.framework[0] == DISTRIBUTING_FRAMEWORKS[ACCELERATOR] else ScriptKind.FRAMEWORK
        if DP_WRAPPER in qualnames:
            return ScriptKind.DATA_PARALLEL
        return ScriptKind.SINGLE

    @cached_property
    def framework(self) -> tuple[str, CallSite] | None:
        """The library that distributes this script (Accelerate, Lightning, ...) and the call that
        hands it the training: `Accelerator()`, `pl.Trainer(...)`, `deepspeed.initialize(...)`, or a
        local subclass of one of them."""
        subclasses = {
            name: DISTRIBUTING_FRAMEWORKS[base]
            for name, node in ((n.name, n) for n in self.tree.body if isinstance(n, ast.ClassDef))
            for base in (self.qualname(b) for b in node.bases) if base in DISTRIBUTING_FRAMEWORKS
        }
        for call in self.calls:
            label = DISTRIBUTING_FRAMEWORKS.get(call.qualname) or subclasses.get(call.qualname)
            if label:
                return label, call
        return None

    @property
    def has_top_level_training(self) -> bool:
        """Does module-level code (or a local function it calls) run training steps?"""
        return self.body_contains(self.tree.body, self.is_training_call)

    # ----- loaders and the loops that train on them ------------------------------------------
    @property
    def train_loaders(self) -> list[LoaderSite]:
        return [ld for ld in self.loaders if ld.is_train]

    def loader_shuffles(self, loader: LoaderSite) -> bool:
        """May the loader shuffle? No only for a DataLoader call with no `shuffle` (or a literal False)
        and no `**options` that may hold one, or a call of another file's function whose loaders are
        all built so; a loader handed in from elsewhere may."""
        if loader.call is None:
            return True
        if loader.built_elsewhere:
            exported = self.facts.imported.get(self.qualname(loader.call.func) or "")
            return exported is None or not exported.unshuffled or loader.index is not None
        if any(kw.arg is None for kw in loader.call.keywords):
            return True
        shuffle = argument(loader.call, 2, "shuffle")  # DataLoader(dataset, batch_size, shuffle, ...)
        return shuffle is not None and not constant(shuffle, False)

    def epoch_loops_around(self, loader: LoaderSite) -> list[LoopSite]:
        """Epoch loops whose body trains on `loader` (in a step loop here, or through a call into another file)."""
        steps = {s.node for s in (*self.step_loops, *self.delegated_steps) if s.trains and loader in s.loaders}
        return [e for e in self.epoch_loops if self.body_contains(e.node.body, lambda n: n in steps)]  # type: ignore[attr-defined]

    def forward_to_backward(self, body: list[ast.stmt]) -> tuple[int, int, ast.Call] | None:
        """In a step's statements: the index of the first one calling a model, of the one calling
        `backward()` after it, and that model call."""
        first = forward = None
        for i, stmt in enumerate(body):
            for node in ast.walk(stmt):
                if forward is None and isinstance(node, ast.Call) and self.has_role(node.func, ROLE_MODEL):
                    first, forward = i, node
                if forward is not None and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
                    return first, i, forward  # type: ignore[return-value]
        return None
