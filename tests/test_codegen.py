"""The renderer that reuses statement texts (ddpify/codemods/codegen.py) writes what LibCST writes."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

import ddpify.codemods.pipeline as pipeline
from ddpify.codemods.codegen import Renderer, code_of
from ddpify.convert import convert_source
from helpers import keep_conversion

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SCRIPTS = sorted([*FIXTURES.glob("*.py"), *FIXTURES.glob("real/*.py")])


@pytest.mark.parametrize("code", [
    "", "\n", "x = 1", "x = 1\n", "# only a comment\n", "if x:\n  y = 2\r\nz = 3\r\n",
    "class A:\n\tdef f(self): return 1", "def f():\n    pass\n\n\n# a footer comment\n",
])
def test_a_module_renders_as_libcst_writes_it_the_first_time_and_again(code):
    module, renderer = cst.parse_module(code), Renderer()
    assert renderer.code(module) == code
    assert renderer.code(module) == code
    assert code_of(module) == code


def test_every_fixture_renders_without_positions_as_libcst_writes_it():
    for script in SCRIPTS:
        text = script.read_text()
        assert code_of(cst.parse_module(text)) == text, script


def test_a_reused_statement_moved_to_the_end_of_the_file_loses_only_its_newline():
    module, renderer = cst.parse_module("if a:\n    b = 1\nc = 2\n"), Renderer()
    renderer.code(module)
    moved = module.with_changes(body=[module.body[1], module.body[0]], has_trailing_newline=False)
    assert renderer.code(moved) == moved.code == "c = 2\nif a:\n    b = 1"


def test_a_reused_statement_at_another_indentation_is_rendered_again():
    module, renderer = cst.parse_module("x = 1\n"), Renderer()
    renderer.code(module)
    nested = cst.Module(body=[cst.If(test=cst.Name("a"), body=cst.IndentedBlock(body=[module.body[0]]))])
    assert renderer.code(nested) == nested.code == "if a:\n    x = 1\n"


class _CheckedRenderer(Renderer):
    def code(self, module: cst.Module) -> str:
        rendered = super().code(module)
        assert rendered == module.code
        return rendered


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_every_stage_of_every_fixture_conversion_renders_as_libcst_writes_it(monkeypatch, target):
    """Each stage's render checked against LibCST's: the conversions are the converter's own, kept for the
    tests that read the same fixtures' conversions (tests/helpers.py: converted_file)."""
    monkeypatch.setattr(pipeline, "Renderer", _CheckedRenderer)
    for script in SCRIPTS:
        keep_conversion(script, target, convert_source(script.read_text(), target, path=str(script)))
