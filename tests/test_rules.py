"""Every discovered rule's own VALID/INVALID cases become tests, plus the checks every rule must pass."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from ddpify.anatomy import ScriptKind, analyze
from ddpify.lint.docs import SECTIONS, render_reference, rule_doc
from ddpify.lint.engine import Options, RuleSet, check_text, fix_text
from ddpify.lint.registry import RuleError, all_rules, discover
from ddpify.lint.rule import SEVERITIES, Invalid, Rule

REPO_ROOT = Path(__file__).resolve().parents[1]
RULES = all_rules()
VALID = [pytest.param(rule, snippet, id=f"{rule.code}-valid{i}") for rule in RULES for i, snippet in enumerate(rule.VALID)]
INVALID = [pytest.param(rule, case, id=f"{rule.code}-invalid{i}") for rule in RULES for i, case in enumerate(rule.INVALID)]
EACH_RULE = pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])


def findings_of(rule: type[Rule], text: str):
    diagnostics, errors = check_text(text, "<case>", RuleSet([rule]))
    assert not errors
    return diagnostics


@pytest.mark.parametrize(("rule", "snippet"), VALID)
def test_valid_case_gives_no_finding(rule, snippet):
    assert [(d.pos.line, d.message) for d in findings_of(rule, snippet)] == []


@pytest.mark.parametrize(("rule", "case"), INVALID)
def test_invalid_case_gives_finding_on_its_line(rule, case):
    kind = analyze(case.code).kind
    assert kind in rule.applies_to, f"the snippet is a {kind.value} script, which {rule.code} does not check"
    assert case.line in [d.pos.line for d in findings_of(rule, case.code)]


@pytest.mark.parametrize(("rule", "case"), [p for p in INVALID if p.values[1].fixed is not None])
def test_fixes_give_the_expected_source(rule, case):
    fixed, applied, _, errors = fix_text(case.code, "<case>", RuleSet([rule]), Options(fix=True, unsafe_fixes=True))
    assert not errors
    assert applied >= 1
    assert fixed == case.fixed


@pytest.mark.parametrize(("rule", "case"), [p for p in INVALID if p.values[1].fixed is not None])
def test_fixed_source_gives_no_finding(rule, case):
    """What the fixes write is a VALID case too: a fix removes the problem and brings no new one."""
    assert [(d.pos.line, d.message) for d in findings_of(rule, case.fixed)] == []


@EACH_RULE
def test_rule_metadata(rule):
    assert re.fullmatch(r"(DDP|DP|FSDP)\d{3}", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    assert rule.message and "\n" not in rule.message
    assert rule.severity in SEVERITIES
    assert rule.applies_to
    assert rule.INVALID, "every rule needs at least one INVALID case"


@EACH_RULE
def test_rule_docstring_has_every_section(rule):
    assert rule_doc(rule).missing() == []


def test_codes_and_names_are_unique():
    assert len({r.code for r in RULES}) == len(RULES)
    assert len({r.name for r in RULES}) == len(RULES)


def test_a_rule_names_itself_in_its_class_statement():
    class Sharded(Rule, code="FSDP998", name="sharded", severity="info"):
        """Doc."""

    assert (Sharded.code, Sharded.name, Sharded.severity) == ("FSDP998", "sharded", "info")
    assert Sharded.applies_to == frozenset({ScriptKind.DDP, ScriptKind.SPAWN})


def test_applies_to_follows_the_code_family_unless_the_rule_sets_it():
    class Replicas(Rule, code="DP998", name="replicas"):
        """Doc."""

    class Everywhere(Rule, code="DDP998", name="everywhere"):
        """Doc."""

        applies_to = frozenset(ScriptKind)

    assert Replicas.applies_to == frozenset({ScriptKind.DATA_PARALLEL})
    assert Everywhere.applies_to == frozenset(ScriptKind)


@pytest.mark.parametrize("code", [None, "XYZ001", "DDP3"])
def test_a_rule_without_a_valid_code_fails_at_class_creation(code):
    with pytest.raises(TypeError, match="needs a code"):
        type("Nameless", (Rule,), {}, code=code, name="nameless")


def test_a_fixed_case_is_reported_where_its_edit_is_unless_told():
    case = Invalid.fixed_by("a = 1\nb = f(x)\n", old="f(x)", new="f(x, y)")
    assert (case.line, case.fixed) == (2, "a = 1\nb = f(x, y)\n")
    assert Invalid.fixed_by("f(\n    x,\n)\n", old="    x,\n", new="    x,\n    y,\n", line=1).line == 1
    with pytest.raises(ValueError, match="2 times"):
        Invalid.fixed_by("x\nx\n", old="x", new="y")


def test_discovery_refuses_duplicate_codes(tmp_path, monkeypatch):
    package = tmp_path / "dup_rules"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("one", "two"):
        (package / f"{name}.py").write_text(textwrap.dedent(f"""
            from ddpify.lint import Rule
            class R{name}(Rule):
                code = "DDP999"
                name = "{name}"
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import dup_rules

    with pytest.raises(RuleError, match="DDP999"):
        discover(dup_rules)
    monkeypatch.delitem(sys.modules, "dup_rules")


def test_docstring_headings_may_be_markdown_colon_or_underlined():
    class Styles(Rule, code="DDP999", name="styles"):
        """Summary line.

        ## What it does
        a
        Why is this bad?:
        b
        Example
        -------
        c
        use instead
        d
        # Fix safety
        e
        """

    doc = rule_doc(Styles)
    assert doc.summary == "Summary line."
    assert [doc.sections[s] for s in SECTIONS] == ["a", "b", "c", "d", "e"]


def test_docs_reference_is_current():
    current = (REPO_ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert current == render_reference(), "run: python -m ddpify.lint.docs > docs/rules.md"
