"""What a conversion tells the user: the changes it made, its advice, the work it left missing,
and the imports its transforms need (a `Report` per transform; the pipeline gathers them)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar


_Reported = TypeVar("_Reported", bound="Reported")


@dataclass(frozen=True)
class Reported:
    """What a transform reports, at a line of the code it was planned on."""

    line: int

    def at(self: _Reported, line: int) -> _Reported:
        """The same report at another line (the original file's, once the pipeline carries it back)."""
        return replace(self, line=line)


@dataclass(frozen=True)
class Change(Reported):
    """One rewrite, reported to the user: `train.py:42: [wrap] wrapped model in DDP`."""

    transform: str
    message: str


@dataclass(frozen=True)
class Advice(Reported):
    """Something the codemod could not do safely; the user must look at it by hand."""

    message: str


@dataclass(frozen=True)
class Missing(Reported):
    """Work the conversion needs but could not do: the result is incomplete until it is done by hand."""

    what: str  # "no model was wrapped in DistributedDataParallel"
    todo: str  # what to do by hand

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}; {self.todo}"


@dataclass(frozen=True)
class Import:
    """An import a transform needs; the pipeline adds them all in one pass at the end."""

    module: str
    obj: str | None = None
    asname: str | None = None

    @property
    def local_name(self) -> str:
        return self.asname or self.obj or self.module.split(".")[0]

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.obj}" if self.obj else self.module if self.asname else self.module.split(".")[0]


@dataclass
class Report:
    """What one transform did and what it left to the user (lines of its own input)."""

    changes: list[Change] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    imports: list[Import] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    fulfilled: bool = False  # the transform's DUTY was done at least once
