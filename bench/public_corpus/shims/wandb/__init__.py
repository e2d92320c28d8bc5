"""A stand-in for wandb in the public corpus: runs log nowhere (no account, no network here)."""

from __future__ import annotations

__version__ = "0.0+ddpify-corpus-shim"


class Config(dict):
    def update(self, values=None, allow_val_change=False, **kwargs):
        super().update(values or {}, **kwargs)


class Run:
    def __init__(self, **kwargs):
        self.config, self.name = Config(kwargs.get("config") or {}), kwargs.get("name", "offline")

    def log(self, data=None, step=None, commit=None, **kwargs):
        return None

    def finish(self, *args, **kwargs):
        return None

    def watch(self, *args, **kwargs):
        return None


class _Media:
    def __init__(self, *args, **kwargs):
        self.args = args


Image = Histogram = Table = Video = _Media
run: Run | None = None


def init(**kwargs) -> Run:
    global run
    run = Run(**kwargs)
    return run


def log(data=None, step=None, commit=None, **kwargs):
    return None


def watch(*args, **kwargs):
    return None


def finish(*args, **kwargs):
    return None
