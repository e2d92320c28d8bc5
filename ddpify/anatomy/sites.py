"""The facts the analysis finds in a training script, each tied to a place in the source."""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass, field

MODULE_SCOPE = "<module>"


class ScriptKind(enum.Enum):
    """How a script uses GPUs; rules and transforms pick the scripts they apply to by kind."""

    NOT_TORCH = "not-torch"
    SINGLE = "single-gpu"
    DATA_PARALLEL = "dataparallel"
    DDP = "ddp"
    SPAWN = "mp.spawn"
    ACCELERATE = "accelerate"  # distributed by Hugging Face Accelerate: one process per device, as DDP
    FRAMEWORK = "framework"  # distributed by another library (Lightning, HF Trainer, DeepSpeed)

    @property
    def distributed(self) -> bool:
        return self in (ScriptKind.DDP, ScriptKind.SPAWN, ScriptKind.ACCELERATE, ScriptKind.FRAMEWORK)

    @property
    def by_a_library(self) -> bool:
        """Distributed by a library that launches, wraps and shards itself (`Anatomy.framework` names it)."""
        return self in (ScriptKind.ACCELERATE, ScriptKind.FRAMEWORK)


@dataclass(frozen=True)
class Pos:
    """A source range: 1-based lines, 0-based character columns (LibCST's convention)."""

    line: int
    col: int
    end_line: int
    end_col: int


@dataclass(frozen=True)
class Ref:
    """A variable that holds a value: a local or global name, or `self.attr` of a class."""

    scope: str
    name: str


@dataclass(eq=False)
class Site:
    """One fact: the AST node, its range, the statement holding it, and its scope."""

    node: ast.AST
    pos: Pos
    stmt: ast.stmt
    scope: str

    @property
    def line(self) -> int:
        return self.pos.line


@dataclass(eq=False)
class ModelSite(Site):
    """Where a model is constructed and bound (`model = Net()`, `self.model = Net().to(dev)`)."""

    target: Ref = None  # type: ignore[assignment]
    class_name: str = ""
    has_batchnorm: bool | None = None  # None: a model class this file does not define
    container: str | None = None  # "list" or "dict" when `target` holds several models
    placements: list[ast.stmt] = field(default_factory=list)
    casts: list[ast.stmt] = field(default_factory=list)  # the later statements of its block that change its parameters' dtype

    @property
    def ready_at(self) -> ast.stmt:
        """The statement after which its parameters are final (bound, moved, cast): a wrapper built
        earlier would keep the device and dtype they had then (DDP's buckets, FSDP's shards)."""
        return max([self.stmt, *self.placements, *self.casts], key=lambda stmt: (stmt.lineno, stmt.col_offset))


@dataclass(eq=False)
class LoaderSite(Site):
    """A `DataLoader(...)` call; `is_train` when a training step loop iterates it."""

    target: Ref | None = None
    is_train: bool = False
    call: ast.Call = None  # type: ignore[assignment]
    built_elsewhere: bool = False  # stands for a loader another file builds (its call or parameter is here)
    handled_elsewhere: bool = False  # another file iterates it and loops over its epochs
    index: int | None = None  # its place in the tuple another file's function returns


@dataclass(eq=False)
class LoopSite(Site):
    """A `for` loop: a step loop over a loader, or an epoch loop around training steps."""

    loader: LoaderSite | None = None
    zipped: tuple[LoaderSite, ...] = ()  # the other loaders `zip(loader, ...)` walks with it
    loop_var: str | None = None
    trains: bool = False

    @property
    def loaders(self) -> tuple[LoaderSite, ...]:
        """Every loader the loop walks (several, zipped)."""
        return (self.loader, *self.zipped) if self.loader is not None else ()


@dataclass(eq=False)
class CallSite(Site):
    """A call of interest: print, logging, torch.save, torch.load, backward, optimizer.step, ..."""

    qualname: str = ""
    receiver: Ref | None = None
