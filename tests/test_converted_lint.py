"""ddpify's converted output passes ddpify's own lint (every default rule) whenever it is complete.

Every fixture (fixtures/*.py and the real-shaped corpus under fixtures/real/, when present) is
converted with --to ddp and --to dp. A complete conversion must lint clean; an incomplete one
must say what is missing (its findings are what the user still has to do by hand).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddpify.codemods.pipeline import Status
from ddpify.lint.engine import check_text, rule_set
from ddpify.lint.registry import all_rules

try:
    from helpers import converted_file
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import converted_file

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SCRIPTS = sorted([*FIXTURES.glob("*.py"), *(FIXTURES / "real").rglob("*.py")])
DEFAULT_RULES = rule_set(frozenset(r.code for r in all_rules() if r.default_enabled))


def test_the_corpus_is_found():
    assert len(SCRIPTS) >= 20


@pytest.mark.parametrize("target", ["ddp", "dp"])
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.relative_to(FIXTURES).as_posix() for p in SCRIPTS])
def test_a_complete_conversion_lints_clean(script: Path, target: str):
    result = converted_file(script, target)
    if result.status is Status.INCOMPLETE:
        assert all(m.what and m.todo for m in result.missing)
        return
    findings, errors = check_text(result.output, str(script), DEFAULT_RULES)
    assert not errors
    assert [f"{d.pos.line}: {d.code} {d.message}" for d in findings] == [], f"{result.status.value} conversion does not lint clean"
