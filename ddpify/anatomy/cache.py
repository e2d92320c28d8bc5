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
