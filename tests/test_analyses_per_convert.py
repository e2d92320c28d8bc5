"""A conversion analyses its file once per pipeline stage plus once for the lint of its output: the
project layer's analysis is the first stage's (ddpify.project_conversion hands it on), and the
input is syntax-checked once."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from ddpify.anatomy import Anatomy
from ddpify.project_conversion import plan_conversion

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture
def counts(monkeypatch):
    """How many analyses (Anatomy objects made) and full compiles of a file (syntax checks) happen."""
    made = {"analyses": 0, "compiles": []}
    analyse, compile_ = Anatomy.__init__, builtins.compile

    def counted_analysis(self, *args, **kwargs):
        made["analyses"] += 1
        analyse(self, *args, **kwargs)

    def counted_compile(source, filename, mode, flags=0, *args, **kwargs):
        if mode == "exec" and not flags & ast.PyCF_ONLY_AST:
            made["compiles"].append(str(filename))
        return compile_(source, filename, mode, flags, *args, **kwargs)

    monkeypatch.setattr(Anatomy, "__init__", counted_analysis)
    monkeypatch.setattr(builtins, "compile", counted_compile)
    return made


def _convert(path: Path, target: str):
    plan = plan_conversion([path], [path], target, {}, "write", None)
    return plan.jobs[path].convert()


@pytest.mark.parametrize(("fixture", "target", "analyses"), [
    # one stage: the project's analysis plans it, the output's analysis lints it
    ("basic_main.py", "dp", 2),
    # two stages: the rank-0 duties read the wrap's edits (ddpify.codemods.pipeline), so the code the
    # first stage produced is analysed again
    ("basic_main.py", "ddp", 3),
    ("basic_main.py", "fsdp", 3),
])
def test_a_one_file_convert_analyses_once_per_stage_and_once_for_lint(counts, fixture, target, analyses):
    path = FIXTURES / fixture
    result = _convert(path, target)
    assert result.changed
    assert counts["analyses"] == analyses
    assert counts["compiles"].count(str(path)) == 1
