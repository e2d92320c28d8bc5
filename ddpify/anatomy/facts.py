"""What one file of a project learns from the others (built by ddpify.anatomy.project).

The per-file analysis stays the one place that understands a file; these facts only name what
crosses a file boundary: what an imported name is (a model class, a function returning a loader,
one that trains on a loader it is given), what callers in other files pass to this file's functions,
and which of this file's returned loaders another file trains on. They are keyed by names, never by
positions, so they hold for every pass of the codemod pipeline over the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STEPS = "steps"  # the callee runs training steps over the loader; its caller loops over epochs
EPOCHS = "epochs"  # the callee loops over epochs itself (and calls set_epoch there)
EVALUATES = "evaluates"  # the callee iterates the loader without training on it


@dataclass(frozen=True)
class ScatterHazard:
    """What DataParallel's scatter or gather breaks in a model's forward, seen where forward is defined."""

    line: int  # in the file that defines forward
    why: str  # what goes wrong, for the user
    parameter: str | None = None  # the argument that must not be split along dim 0; None: the output cannot be gathered
    index: int = -1  # that parameter's position after self


@dataclass(frozen=True)
class ReplicaFacts:
    """What converting to DataParallel needs to know of a model class that another file defines."""

    path: str  # the file that defines it
    hazards: tuple[ScatterHazard, ...] = ()
    forward_aliases: frozenset[str] = frozenset()  # methods that only call forward with their own arguments
    methods: frozenset[str] = frozenset()  # every method its class body defines (forward among them)


@dataclass(frozen=True)
class Exported:
    """A class or function another file imports, as seen from the file that defines it."""

    roles: frozenset[str] = frozenset()  # what calling it returns ("model" for an nn.Module class)
    items: tuple[frozenset[str], ...] = ()  # what each item of the tuple it returns is
    has_batchnorm: bool | None = None  # for a model it returns; None when unknown
    params: tuple[str, ...] = ()  # the parameters a call binds, in order (a class: its __init__'s)
    trains: tuple[tuple[str, str], ...] = ()  # (parameter, STEPS, EPOCHS or EVALUATES): loaders it iterates
    is_model_class: bool = False
    replica: ReplicaFacts | None = None  # a model class: what DataParallel must know of its forward
    # calling it on rank 0 alone (in a print's f-string) leaves no rank waiting or behind: it neither
    # trains, evaluates, calls a model, joins a collective nor calls what is not known to be harmless
    rank_zero_safe: bool = False
    unshuffled: bool = False  # every loader it returns is built without shuffle: its sampler needs no set_epoch

    def param_for(self, index: int | None, keyword: str | None) -> str | None:
        if keyword is not None:
            return keyword if keyword in self.params else None
        return self.params[index] if index is not None and index < len(self.params) else None


@dataclass(frozen=True)
class Incoming:
    """What callers in other files pass to one parameter of this file's function."""

    roles: frozenset[str] = frozenset()
    has_batchnorm: bool | None = None
    wrapped: bool = False  # a model that the caller has already wrapped in DDP


@dataclass(frozen=True)
class ProjectFacts:
    """Everything one file learns from its project; empty for a lone script."""

    imported: dict[str, Exported] = field(default_factory=dict)  # qualname as this file spells it
    params: dict[str, dict[str, Incoming]] = field(default_factory=dict)  # function scope -> param -> what arrives
    # (function scope, tuple index or None) of loaders this file returns and another file uses ...
    returned_elsewhere: frozenset[tuple[str, int | None]] = frozenset()
    trained_returns: frozenset[tuple[str, int | None]] = frozenset()  # ... and trains on
    models_trained_elsewhere: bool = False  # another file of the project has the optimizer of a model
    data_loaded_elsewhere: bool = False  # another file of the project iterates a training loader of its own

    def __bool__(self) -> bool:
        return bool(self.imported or self.params or self.returned_elsewhere)

    def returns(self, qualname: str, role: str) -> bool:
        exported = self.imported.get(qualname)
        return exported is not None and role in exported.roles


NO_FACTS = ProjectFacts()
