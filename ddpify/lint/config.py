"""Which rules run on which file: `[tool.ddpify]` in pyproject.toml plus the command-line flags.

Selection follows ruff. A selector is a rule code ("DDP001") or a prefix of codes ("DDP", "DP0").
For each rule, the most specific matching selector among `select` + `extend-select` and `ignore`
decides (a tie goes to `ignore`); a rule no selector matches is on when it is `default_enabled`
and `select` was not given. Rules that are off by default are turned on only by their exact code
or by `ALL`, which selects every rule and is less specific than any prefix.
`per-file-ignores` then turns codes off for files matching a glob (gitignore syntax, relative to
the directory of the config file, or of the current directory when there is none).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

import pathspec

from ddpify.lint.rule import Rule

CONFIG_FILE = "pyproject.toml"
RULE_FAMILIES = ("DDP", "DP", "FSDP")  # valid selectors even while a family has no rule yet
ALL_SELECTOR = "ALL"
_LIST_KEYS = ("select", "ignore", "extend-select", "exclude")
KNOWN_KEYS = (*_LIST_KEYS, "per-file-ignores")


class ConfigError(Exception):
    """The configuration is unreadable or invalid; `str(e)` names the file."""


@dataclass(frozen=True)
class Config:
    """The lint settings in force; `root` is where per-file-ignores globs are relative to."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = ()
    root: str = field(default_factory=os.getcwd)
    path: str | None = None

    def with_overrides(self, select: Sequence[str] | None, ignore: Sequence[str] | None,
                       extend_select: Sequence[str] | None) -> "Config":
        """Command-line selectors replace the configured ones (extend-select adds)."""
        return replace(
            self,
            select=tuple(select) if select is not None else self.select,
            ignore=tuple(ignore) if ignore is not None else self.ignore,
            extend_select=self.extend_select + tuple(extend_select or ()),
        )

    def validate(self, rules: Iterable[type[Rule]]) -> None:
        """Raise ConfigError naming the first selector that matches no rule (likely a typo)."""
        codes = [r.code for r in rules]
        selectors = [*(self.select or ()), *self.ignore, *self.extend_select]
        selectors += [code for _, codes_ in self.per_file_ignores for code in codes_]
        for selector in selectors:
            if selector not in (*RULE_FAMILIES, ALL_SELECTOR) and not any(code.startswith(selector) for code in codes):
                raise ConfigError(f"{self.path or 'command line'}: unknown rule code or prefix {selector!r}")

    def enabled(self, rules: Iterable[type[Rule]], path: str) -> frozenset[str]:
        """Codes of the rules that run on `path`."""
        off = self.ignored_for(path)
        return frozenset(r.code for r in rules if self.is_selected(r) and not _matches(r.code, off))

    def is_selected(self, rule: type[Rule]) -> bool:
        """Is the rule on, before per-file-ignores?"""
        chosen = (*(self.select or ()), *self.extend_select)
        if not rule.default_enabled:
            chosen = tuple(s for s in chosen if s in (rule.code, ALL_SELECTOR))
        best_on = _specificity(rule.code, chosen)
        best_off = _specificity(rule.code, self.ignore)
        if best_on < 0 and best_off < 0:
            return rule.default_enabled and self.select is None
        return best_on > best_off

    def ignored_for(self, path: str) -> tuple[str, ...]:
        """The per-file-ignores codes whose glob matches `path`."""
        if not self.per_file_ignores:
            return ()
        rel = _relative_posix(path, self.root)
        return tuple(code for spec, codes in self._per_file_specs for code in codes if spec.match_file(rel))

    @cached_property
    def _per_file_specs(self) -> list[tuple[pathspec.PathSpec, tuple[str, ...]]]:
        return [(pathspec.GitIgnoreSpec.from_lines([glob]), codes) for glob, codes in self.per_file_ignores]


def _specificity(code: str, selectors: Iterable[str]) -> int:
    """Length of the longest selector that is a prefix of `code` (ALL: 0); -1 if none is."""
    return max((0 if s == ALL_SELECTOR else len(s) for s in selectors if s == ALL_SELECTOR or code.startswith(s)), default=-1)


def _matches(code: str, selectors: Iterable[str]) -> bool:
    return _specificity(code, selectors) >= 0


def _relative_posix(path: str, root: str) -> str:
    absolute = os.path.abspath(path)
    rel = os.path.relpath(absolute, root)
    return Path(absolute if rel.startswith("..") else rel).as_posix()


def find_config(start: str | os.PathLike) -> Path | None:
    """The nearest pyproject.toml with a [tool.ddpify] table, walking up from `start`."""
    here = Path(start).resolve()
    if not here.is_dir():
        here = here.parent
    for directory in (here, *here.parents):
        candidate = directory / CONFIG_FILE
        if candidate.is_file() and "ddpify" in _read_toml(candidate).get("tool", {}):
            return candidate
    return None


def config_for(start: str, config_path: str | os.PathLike | None = None) -> Config:
    """The config at `config_path` when given, else the nearest above `start` (the current
    directory when `start` does not exist), else defaults: what `ddpify lint` and `ddpify server` use."""
    return load_config(config_path or find_config(start if Path(start).exists() else "."))


def load_config(path: str | os.PathLike | None) -> Config:
    """The settings in `path`'s [tool.ddpify] table (defaults when `path` is None)."""
    if path is None:
        return Config()
    path = Path(path)
    table = _read_toml(path).get("tool", {}).get("ddpify", {})
    return _config_from_table(table, path)


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {(e.strerror or str(e)).lower()}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


def _config_from_table(table: dict, path: Path) -> Config:
    _reject_unknown_keys(table, path)
    values = {key: _string_list(table, key, path) for key in _LIST_KEYS if key in table}
    values.update({key: upper_all(v) for key, v in values.items() if key != "exclude"})
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{path}: [tool.ddpify] per-file-ignores must be a table of glob = [codes]")
    return Config(
        select=values.get("select"),
        ignore=values.get("ignore", ()),
        extend_select=values.get("extend-select", ()),
        per_file_ignores=tuple((glob, upper_all(_string_list(per_file, glob, path))) for glob in per_file),
        exclude=values.get("exclude", ()),
        root=str(path.resolve().parent),
        path=str(path),
    )


def _reject_unknown_keys(table: dict, path: Path) -> None:
    """A misspelt key would otherwise be ignored silently: name it, and the key it probably meant."""
    for key in table:
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(KNOWN_KEYS)})"
            raise ConfigError(f"{path}: unknown key {key!r} in [tool.ddpify]{hint}")


def upper_all(codes: Iterable[str]) -> tuple[str, ...]:
    """Selectors are case-insensitive: `ddp001` is DDP001."""
    return tuple(code.strip().upper() for code in codes)


def _string_list(table: dict, key: str, path: Path) -> tuple[str, ...]:
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [tool.ddpify] {key} must be a list of strings")
    return tuple(value)
