"""One caching idiom for the facts read from an `Anatomy`: computed on first use, kept on it."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

T = TypeVar("T")


def per_anatomy(fn: Callable[[object], T]) -> Callable[[object], T]:
    """Cache a whole-script answer on the anatomy it was asked of, so every rule and codemod that
    asks the same question shares one answer (keyed by the function's module and name)."""
    key = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def cached(anatomy):
        facts = anatomy.__dict__.setdefault("_facts", {})
        if key not in facts:
            facts[key] = fn(anatomy)
        return facts[key]

    return cached


def forgetful_copy(anatomy: T) -> T:
    """A shallow copy of `anatomy` that remembers none of the answers found on it (the per_anatomy
    facts, its cached properties): for an anatomy made to answer for other code (wraps_made)."""
    remembered = {name for cls in type(anatomy).__mro__ for name, value in vars(cls).items()
                  if isinstance(value, functools.cached_property)} | {"_facts"}
    copy = object.__new__(type(anatomy))
    copy.__dict__.update({name: value for name, value in anatomy.__dict__.items() if name not in remembered})
    return copy
