"""The rule API: what a lint rule is, what it yields, and how its fixes are spelled.

One rule per module in the top-level `rules/` directory (shipped as `ddpify.rules`). A rule names
itself in its class statement, reads the script's `Anatomy` and yields `Finding`s; the engine does
everything else (selection by kind and config, suppression comments, output formats, applying
fixes):

    class SamplerWithoutSetEpoch(Rule, code="DDP003", name="sampler-without-set-epoch", severity="warning"):
        "(the rule's documentation: What it does, Why is this bad?, ...)"

        message = "DistributedSampler never gets `set_epoch(epoch)`: every epoch uses the same shuffle"

        def check(self, a):
            ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Iterable

from ddpify.anatomy import Anatomy, Pos, ScriptKind

SEVERITIES = ("error", "warning", "info")

# The scripts a family of rules checks, by the letters its codes start with. FSDP runs one process
# per GPU as DDP does, so the FSDP rules check the same scripts as the DDP rules.
_PROCESS_PER_GPU = frozenset({ScriptKind.DDP, ScriptKind.SPAWN})
FAMILY_KINDS = {"DDP": _PROCESS_PER_GPU, "FSDP": _PROCESS_PER_GPU, "DP": frozenset({ScriptKind.DATA_PARALLEL})}
_CODE = re.compile(r"(?P<family>[A-Z]+)\d{3}")


@dataclass(frozen=True)
class Edit:
    """Replace the source text between two LibCST-style positions (1-based line, 0-based char col).

    An insertion is an edit whose start and end are the same position.
    """

    line: int
    col: int
    end_line: int
    end_col: int
    text: str

    @classmethod
    def replace(cls, pos: Pos, text: str) -> "Edit":
        """Replace the range `pos` (e.g. a `Site.pos` or `anatomy.pos(node)`) with `text`."""
        return cls(pos.line, pos.col, pos.end_line, pos.end_col, text)

    @classmethod
    def insert(cls, line: int, col: int, text: str) -> "Edit":
        """Insert `text` before the character at (`line`, `col`)."""
        return cls(line, col, line, col, text)


@dataclass(frozen=True)
class Fix:
    """A set of edits applied together; `safe` fixes are applied by `--fix`, unsafe ones need
    `--unsafe-fixes` (they may change behaviour)."""

    edits: tuple[Edit, ...]
    safe: bool
    description: str


@dataclass(frozen=True)
class Finding:
    """What a rule yields: where, optionally a specific message (else the rule's), and a fix."""

    pos: Pos
    message: str | None = None
    fix: Fix | None = None


@dataclass(frozen=True)
class Invalid:
    """A test case: `code` is a whole little script on which the rule must report at `line`.

    `fixed`, when given, is the whole source expected after applying the rule's fixes (unsafe too).
    """

    code: str
    line: int
    fixed: str | None = None

    @classmethod
    def fixed_by(cls, code: str, old: str, new: str, line: int | None = None) -> "Invalid":
        """A case whose fixes turn the one `old` in `code` into `new`, reported on the line where
        `old` starts unless `line` says otherwise."""
        if code.count(old) != 1:
            raise ValueError(f"{old!r} stands {code.count(old)} times in the case, not once")
        where = code.count("\n", 0, code.index(old)) + 1
        return cls(code, where if line is None else line, code.replace(old, new))


class Rule:
    """Base class of lint rules. The subclass docstring is the rule's documentation, with the
    sections "What it does", "Why is this bad?", "Example", "Use instead" and "Fix safety".

    A subclass gives its `code`, `name` and `severity` as keywords of its class statement;
    `applies_to` is the kinds of its code's family (`FAMILY_KINDS`) unless the class sets it.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]
    severity: ClassVar[str] = "error"
    applies_to: ClassVar[frozenset[ScriptKind]]
    default_enabled: ClassVar[bool] = True
    VALID: ClassVar[tuple[str, ...]] = ()
    INVALID: ClassVar[tuple[Invalid, ...]] = ()

    def __init_subclass__(
        cls, *, code: str | None = None, name: str | None = None, severity: str | None = None, **kwargs
    ):
        """Take the identity from the class statement; refuse a rule without a code of a known family."""
        super().__init_subclass__(**kwargs)
        for attribute, value in (("code", code), ("name", name), ("severity", severity)):
            if value is not None:
                setattr(cls, attribute, value)
        match = _CODE.fullmatch(getattr(cls, "code", ""))
        if match is None or match["family"] not in FAMILY_KINDS:
            raise TypeError(f"rule {cls.__qualname__} needs a code such as DDP003: class {cls.__name__}(Rule, code=...)")
        if not hasattr(cls, "applies_to"):
            cls.applies_to = FAMILY_KINDS[match["family"]]

    def check(self, anatomy: Anatomy, /) -> Iterable[Finding]:
        """Yield a Finding for each problem in the script (the engine passes it positionally, so a
        rule may name the parameter as its helpers do, usually `a`)."""
        raise NotImplementedError
