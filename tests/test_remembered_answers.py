"""The anatomy remembers what it is asked again and again (ScriptTree.ref, ScriptValues.callee,
roles once the value flow has settled, each function's walked body): the answers it remembered
while a conversion and the lint of its output ran must still be the answers it would find afresh
at the end, for every anatomy the conversion made; and the value flow must find what it finds
with no roles remembered at all. And edits.positions.positions_of must give what LibCST's
MetadataWrapper resolves for PositionProvider (it skips the wrapper's extra walk), and
ScriptTree.nodes_of what a scan of every node for those classes finds."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpify.anatomy import Anatomy, analyze
from ddpify.anatomy.sites import MODULE_SCOPE
from ddpify.anatomy.tree import walk_body
from ddpify.convert import convert_source
from ddpify.edits.positions import positions_of

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SCRIPTS = sorted(FIXTURES.glob("*.py"))
REAL = sorted(FIXTURES.glob("real/*.py"))


@pytest.fixture
def made(monkeypatch) -> list[Anatomy]:
    """Every anatomy made while the test runs."""
    anatomies: list[Anatomy] = []
    build = Anatomy.__init__

    def kept(self, *args, **kwargs):
        build(self, *args, **kwargs)
        anatomies.append(self)

    monkeypatch.setattr(Anatomy, "__init__", kept)
    return anatomies


def stale_answers(a: Anatomy) -> list[str]:
    """The remembered answers of `a` that differ from a fresh look."""
    stale = [f"ref of line {getattr(n, 'lineno', '?')}" for n, ref in a._refs.items()
             if ref != a._find_ref(n, a.scope_of.get(n, MODULE_SCOPE))]
    stale += [f"callee of line {call.lineno}" for call, callee in a._callees.items() if callee != a._find_callee(call)]
    stale += [f"roles of line {getattr(e, 'lineno', '?')}" for e, roles in (a._settled_roles or {}).items()
              if roles != a._find_roles(e)]
    stale += [f"nodes of {scope}" for scope, nodes in a._walked.items() if nodes != list(walk_body(a.functions[scope].node.body))]
    return stale


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_remembered_answers_hold_after_a_conversion(made, target):
    for script in SCRIPTS:
        convert_source(script.read_text(), target, path=str(script))
    asked = [a for a in made if a._callees and a._refs and a._settled_roles]
    assert len(asked) > len(SCRIPTS), "the conversions asked no anatomy anything: the test checks nothing"
    assert {a.path: stale_answers(a) for a in made if stale_answers(a)} == {}


def flowed(a: Anatomy) -> dict:
    """What the value flow found: each variable's, function's and returned item's roles, by role and site position."""
    def named(found):
        return sorted(repr((role, site.pos if site is not None else None)) for role, site in found)

    tables = {"values": a.values, "returns": a.returns, "items": a.item_returns}
    return {name: {key: named(found) for key, found in table.items() if found} for name, table in tables.items()}


def test_the_value_flow_finds_what_it_finds_remembering_nothing(monkeypatch):
    texts = {script: script.read_text() for script in [*SCRIPTS, *REAL]}
    remembering = {script: flowed(analyze(text, str(script))) for script, text in texts.items()}
    monkeypatch.setattr(Anatomy, "settle_values", lambda self: None)
    assert remembering == {script: flowed(analyze(text, str(script))) for script, text in texts.items()}


@pytest.mark.parametrize("script", SCRIPTS[:12], ids=lambda p: p.name)
def test_positions_of_is_what_the_metadata_wrapper_resolves(script):
    module = cst.parse_module(script.read_text())
    assert dict(positions_of(module)) == dict(MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider))


SCANNED_CLASSES = [(ast.Call,), (ast.For, ast.AsyncFor, ast.While), (ast.Assign, ast.AnnAssign, ast.withitem, ast.NamedExpr),
                   (ast.Attribute, ast.Subscript), (ast.For, ast.comprehension), (ast.Expr, ast.With, ast.AsyncWith)]


def test_nodes_of_classes_are_the_nodes_a_scan_finds_in_the_same_order():
    assert not [cls for classes in SCANNED_CLASSES for cls in classes if cls.__subclasses__()]  # "exactly" is "isinstance"
    for script in [*SCRIPTS, *REAL]:
        a = analyze(script.read_text(), str(script))
        for classes in SCANNED_CLASSES:
            assert a.nodes_of(*classes) == [n for n in a.nodes if isinstance(n, classes)], (script.name, classes)
