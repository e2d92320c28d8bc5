"""The DDP rules (DDP002-DDP021) on whole scripts.

* `fixtures/lint/ddp/<name>.py` — buggy DDP scripts; `<name>.expected` next to each lists the
  DDP-rule findings (`LINE:COL CODE`, sorted). Regenerate after an intended change with
  `python tests/test_ddp_rules_fixtures.py` and review the diff.
* `fixtures/clean/ddp_*.py` — correct DDP scripts in different styles; no rule (of any code,
  default-enabled or not) may report anything on them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddpify.lint.engine import Options, RuleSet, check_text, fix_text
from ddpify.lint.registry import all_rules

REPO_ROOT = Path(__file__).resolve().parents[1]
BUGGY = sorted((REPO_ROOT / "fixtures" / "lint" / "ddp").glob("*.py"))
CLEAN = sorted((REPO_ROOT / "fixtures" / "clean").glob("ddp_*.py"))
DDP_RULE_CODES = frozenset(f"DDP{n:03d}" for n in range(2, 22))
ALL_RULES = RuleSet(all_rules())


def ddp_findings(path: Path) -> list[str]:
    diagnostics, errors = check_text(path.read_text(encoding="utf-8"), str(path), ALL_RULES)
    assert not errors
    return [f"{d.pos.line}:{d.pos.col} {d.code}" for d in diagnostics if d.code in DDP_RULE_CODES]


def expected_path(script: Path) -> Path:
    return script.with_suffix(".expected")


def test_fixture_sets_are_there():
    assert len(BUGGY) >= 3 and len(CLEAN) >= 4
    assert DDP_RULE_CODES <= {r.code for r in all_rules()}


@pytest.mark.parametrize("script", BUGGY, ids=[p.stem for p in BUGGY])
def test_buggy_script_gives_the_expected_findings(script: Path):
    expected = expected_path(script).read_text(encoding="utf-8").splitlines()
    assert ddp_findings(script) == expected


def test_buggy_scripts_cover_every_ddp_rule():
    found = {line.split()[1] for script in BUGGY for line in expected_path(script).read_text().splitlines()}
    assert found == DDP_RULE_CODES


@pytest.mark.parametrize("script", BUGGY, ids=[p.stem for p in BUGGY])
def test_all_fixes_on_buggy_script_give_valid_code_and_converge(script: Path):
    text = script.read_text(encoding="utf-8")
    fixed, applied, left, errors = fix_text(text, str(script), ALL_RULES, Options(fix=True, unsafe_fixes=True))
    assert not errors
    assert applied >= 1
    compile(fixed, str(script), "exec")
    assert [d.code for d in left if d.fix is not None] == []


@pytest.mark.parametrize("script", CLEAN, ids=[p.stem for p in CLEAN])
def test_clean_script_gives_no_finding(script: Path):
    diagnostics, errors = check_text(script.read_text(encoding="utf-8"), str(script), ALL_RULES)
    assert not errors
    assert [f"{d.pos.line}:{d.pos.col} {d.code} {d.message}" for d in diagnostics] == []


if __name__ == "__main__":  # regenerate the snapshots
    for script in BUGGY:
        expected_path(script).write_text("".join(f"{line}\n" for line in ddp_findings(script)), encoding="utf-8")
        print(f"wrote {expected_path(script).relative_to(REPO_ROOT)}", file=sys.stderr)
