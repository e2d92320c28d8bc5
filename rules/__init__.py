"""ddpify's lint rules, one per module (shipped as the package `ddpify.rules`).

Each module defines one `ddpify.lint.Rule` subclass; `ddpify.lint.registry.all_rules()` imports
every module here and collects them. A module whose name starts with `_` is imported too, so keep
helpers shared by several rules in such a module and define no Rule subclass there.
"""
