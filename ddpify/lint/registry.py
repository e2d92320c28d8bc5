"""Rule discovery: every `Rule` subclass defined by a module of the `ddpify.rules` package."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from functools import lru_cache
from types import ModuleType

from ddpify.lint.rule import Rule


class RuleError(Exception):
    """The rules package is inconsistent (e.g. two rules share a code)."""


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    """Every rule of ddpify, sorted by code."""
    import ddpify.rules

    return discover(ddpify.rules)


def discover(package: ModuleType) -> tuple[type[Rule], ...]:
    """The Rule subclasses defined by the modules of `package`, sorted by code; raises RuleError
    when two rules share a code."""
    found: dict[str, type[Rule]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for rule in _rules_defined_in(module):
            if rule.code in found:
                raise RuleError(
                    f"rule code {rule.code} is used by both {_where(found[rule.code])} and {_where(rule)}"
                )
            found[rule.code] = rule
    return tuple(found[code] for code in sorted(found))


def _rules_defined_in(module: ModuleType) -> list[type[Rule]]:
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__
    ]


def _where(rule: type[Rule]) -> str:
    return f"{rule.__module__}.{rule.__qualname__}"


def rule_by_code(code: str) -> type[Rule] | None:
    """The rule with this code (case-insensitive), or None."""
    wanted = code.upper()
    return next((r for r in all_rules() if r.code == wanted), None)
