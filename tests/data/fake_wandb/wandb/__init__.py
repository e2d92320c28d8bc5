"""A fake wandb client, faithful where converted scripts lean on it (wandb is not installed here).

As the real client: before `wandb.init`, `wandb.run` is None and `wandb.config`, `wandb.log`,
`wandb.watch` raise `wandb.Error("You must call wandb.init() before ...")`; `init` returns a run and
points the module's `run`, `config`, `summary`, `log`, `watch` at it; `wandb.finish()` finishes the
run there is (none: nothing). With `mode="disabled"` (wandb's documented no-op mode) the run sends
nothing, yet its config, log, summary, watch and finish all work, and its `dir` and `name` are its
own (a temporary directory, "dummy-<id>"). Any other mode "sends": each call is appended, with the
process's RANK, to `sent-<pid>.jsonl` in the working directory, which tests read as the server.
"""

import json
import os
import tempfile
import uuid

MODES = (None, "online", "offline", "disabled")


class Error(Exception):
    """wandb.Error."""


class _PreInit:
    """What `wandb.config` / `wandb.summary` are before `wandb.init`: any use raises Error."""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, key):
        raise Error(f"You must call wandb.init() before {self._name}.{key}")

    def __getitem__(self, key):
        raise Error(f"You must call wandb.init() before {self._name}[{key!r}]")

    def __setattr__(self, key, value):
        raise Error(f"You must call wandb.init() before {self._name}.{key}")


def _pre_init(name):
    def call(*args, **kwargs):
        raise Error(f"You must call wandb.init() before {name}()")
    return call


class Config(dict):
    """A run's config: items read as attributes too (`config.lr`); updates are sent where the run sends."""

    def __init__(self, run, values):
        super().__init__(values)
        object.__setattr__(self, "_run", run)

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key, value):
        self.update({key: value})

    def update(self, values, allow_val_change=False):
        super().update(values)
        _send(self._run, "config", dict(values))


class Run:
    def __init__(self, mode, project, name, config):
        self.disabled = mode == "disabled"
        self.id = uuid.uuid4().hex[:8]
        self.name = f"dummy-{self.id}" if self.disabled else (name or f"run-{self.id}")
        self.dir = tempfile.gettempdir() if self.disabled else os.path.join("wandb", f"run-{self.id}", "files")
        self.project = project
        self.config = Config(self, config or {})
        self.summary = {}
        _send(self, "init", {"project": project, "config": dict(self.config)})

    def log(self, data, step=None, commit=None):
        self.summary.update(data)
        _send(self, "log", dict(data))

    def watch(self, models, log="gradients", log_freq=1000):
        _send(self, "watch", type(models).__name__)

    def finish(self, exit_code=None):
        _send(self, "finish", None)
        _set_globals(None)


def _send(run, what, value):
    """What the server receives: nothing from a disabled run."""
    if run is None or run.disabled:
        return
    record = {"rank": os.environ.get("RANK", "0"), "what": what, "value": value}
    with open(f"sent-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def _set_globals(run):
    global config, summary, log, watch
    globals()["run"] = run
    if run is None:
        config, summary = _PreInit("wandb.config"), _PreInit("wandb.summary")
        log, watch = _pre_init("wandb.log"), _pre_init("wandb.watch")
    else:
        config, summary, log, watch = run.config, run.summary, run.log, run.watch


def init(project=None, name=None, config=None, mode=None, **settings):
    if mode not in MODES:
        raise Error(f"mode must be one of {MODES}, not {mode!r}")
    started = Run(mode, project, name, config)
    _set_globals(started)
    return started


def finish(exit_code=None):
    if run is not None:
        run.finish(exit_code)


run = None
_set_globals(None)
