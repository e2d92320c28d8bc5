"""`ddpify lint`: the rule API, rule discovery, and the engine that runs rules over files."""

from ddpify.lint.rule import Edit, Finding, Fix, Invalid, Rule

__all__ = ["Edit", "Finding", "Fix", "Invalid", "Rule"]
