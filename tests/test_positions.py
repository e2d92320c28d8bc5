"""positions_of (ddpify/edits/positions.py) finds what LibCST's PositionProvider finds."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpify.edits.positions import positions_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _libcst_positions(module: cst.Module) -> dict:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    return dict(wrapper.resolve(PositionProvider))


@pytest.mark.parametrize("code", [
    "x = 1\n", "if a:\r\n    b = f(1,\r\n          2)\r\n", "s = '''one\ntwo'''\nt = 3", "def f():\n\treturn {'a': [1, 2]}\n",
])
def test_every_node_has_libcst_s_range(code):
    module = cst.parse_module(code)
    assert positions_of(module) == _libcst_positions(module)


def test_every_node_of_every_fixture_has_libcst_s_range():
    for script in sorted(FIXTURES.glob("*.py")):
        module = cst.parse_module(script.read_text())
        assert positions_of(module) == _libcst_positions(module), script
