"""The DataParallel rules (DP001-DP008) on whole scripts.

* `fixtures/lint/dp/<name>.py` — buggy DataParallel scripts; `<name>.expected` next to each lists
  the DP-rule findings (`LINE:COL CODE`, 0-based column, sorted), DP007 (off by default) included.
  Regenerate after an intended change with `python tests/test_dp_rules_fixtures.py` and review the diff.
* `fixtures/clean/dp_*.py` — correct DataParallel scripts: no default-enabled rule reports anything.
* `fixtures/expected/dp/*.py` — what `ddpify convert --to dp` writes: the DP rules find nothing
  the codemod could have fixed (state kept in `forward` stays, as the codemod's advice says).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddpify.lint.engine import Options, RuleSet, check_text, fix_text
from ddpify.lint.registry import all_rules

REPO_ROOT = Path(__file__).resolve().parents[1]
BUGGY = sorted((REPO_ROOT / "fixtures" / "lint" / "dp").glob("*.py"))
CLEAN = sorted((REPO_ROOT / "fixtures" / "clean").glob("dp_*.py"))
CONVERTED = sorted((REPO_ROOT / "fixtures" / "expected" / "dp").glob("*.py"))
DP_RULES = [r for r in all_rules() if r.code.startswith("DP0")]
DP_RULE_CODES = frozenset(r.code for r in DP_RULES)
ALL_RULES = RuleSet(all_rules())
DEFAULT_RULES = RuleSet(r for r in all_rules() if r.default_enabled)
KEPT_BY_THE_CODEMOD = {"DP002"}  # state changed in forward: advised, not rewritten


def findings(path: Path, rules: RuleSet) -> list[str]:
    diagnostics, errors = check_text(path.read_text(encoding="utf-8"), str(path), rules)
    assert not errors
    return [f"{d.pos.line}:{d.pos.col} {d.code}" for d in diagnostics]


def dp_findings(path: Path) -> list[str]:
    return [f for f in findings(path, ALL_RULES) if f.split()[1] in DP_RULE_CODES]


def expected_path(script: Path) -> Path:
    return script.with_suffix(".expected")


def test_fixture_sets_are_there():
    assert len(BUGGY) >= 3 and len(CLEAN) >= 2 and len(CONVERTED) >= 20
    assert DP_RULE_CODES == {f"DP00{n}" for n in range(1, 9)}


@pytest.mark.parametrize("script", BUGGY, ids=[p.stem for p in BUGGY])
def test_buggy_script_gives_the_expected_findings(script: Path):
    expected = expected_path(script).read_text(encoding="utf-8").splitlines()
    assert dp_findings(script) == expected


def test_buggy_scripts_cover_every_dp_rule():
    found = {line.split()[1] for script in BUGGY for line in expected_path(script).read_text().splitlines()}
    assert found == DP_RULE_CODES


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
    assert findings(script, DEFAULT_RULES) == []


@pytest.mark.parametrize("script", CONVERTED, ids=[p.stem for p in CONVERTED])
def test_converted_script_leaves_nothing_to_fix(script: Path):
    left = [f for f in findings(script, DEFAULT_RULES) if f.split()[1] not in KEPT_BY_THE_CODEMOD]
    assert left == []


if __name__ == "__main__":  # regenerate the snapshots
    for script in BUGGY:
        expected_path(script).write_text("".join(f"{line}\n" for line in dp_findings(script)), encoding="utf-8")
        print(f"wrote {expected_path(script).relative_to(REPO_ROOT)}", file=sys.stderr)
