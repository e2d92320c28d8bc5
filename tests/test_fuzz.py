"""Property-based fuzzing of convert and lint (fixed, derandomized budget).

(a) line-level mutations of the fixtures; (b) hypothesmith-generated programs prefixed with
`import torch`. For every input that Python parses: convert (ddp and dp) and lint never raise
anything but a clean SourceError, every conversion output compiles, converting the output again
changes nothing, and every lint diagnostic points inside the file.
"""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ddpify.convert import convert_source
from ddpify.lint.config import Config
from ddpify.lint.engine import check_text, rule_set
from ddpify.lint.registry import all_rules
from ddpify.sources import SourceError

ROOT = Path(__file__).resolve().parents[1]
# small fixtures only: one conversion costs about 20-40 ms per line on this machine
FIXTURES = sorted(p for p in (ROOT / "fixtures").glob("*.py") if len(p.read_text().splitlines()) <= 60)
TEXTS = [p.read_text() for p in FIXTURES]
NEWLINE = re.compile(r"\r\n|\r|\n")

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)


def _lines(text: str) -> list[str]:
    lines = NEWLINE.split(text)
    if lines and lines[-1] == "" and len(lines) > 1:
        lines.pop()  # the empty tail after a final newline is not a line
    return lines


def _parses(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def check_convert(text: str, target: str) -> None:
    try:
        result = convert_source(text, target, path="fuzz.py")
    except SourceError:
        return  # a clean, reported error is fine
    out = result.output
    compile(out, "fuzz_out.py", "exec", dont_inherit=True)
    again = convert_source(out, target, path="fuzz_out.py")
    assert again.output == out, f"not idempotent for --to {target}"


def check_lint(text: str) -> None:
    rules = rule_set(Config().enabled(all_rules(), "fuzz.py"))
    try:
        diagnostics, errors = check_text(text, "fuzz.py", rules)
    except SourceError:
        return
    assert not errors, errors  # a rule crashed
    lines = _lines(text)
    for d in diagnostics:
        assert 1 <= d.pos.line <= max(1, len(lines)), (d.code, d.pos, len(lines))
        line = lines[d.pos.line - 1] if lines else ""
        assert 0 <= d.pos.col <= len(line), (d.code, d.pos, line)
        assert d.pos.end_line >= d.pos.line, (d.code, d.pos)


def check_all(text: str) -> None:
    check_lint(text)
    check_convert(text, "ddp")
    check_convert(text, "dp")


# ----- (a) mutations of the fixtures -------------------------------------------------------------
TOKENS = [
    "pass", "x = 1", "model = model.cuda()", "model.to(device)", "loss.backward()", "optimizer.step()",
    "torch.save(model.state_dict(), 'm.pt')", "print(loss.item())", "break", "continue", "return",
    "device = 'cuda'", "import torch.nn as nn", "del model", "global model", "for i in range(2): pass",
    "if True:", "    pass", "with torch.no_grad():", "model = nn.DataParallel(model)", "yield 1",
    "loader = DataLoader(ds, batch_size=8, shuffle=True)", "@torch.no_grad()", "lambda: 0", "(", ")",
]


@st.composite
def mutated_fixture(draw) -> str:
    lines = draw(st.sampled_from(TEXTS)).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "indent", "dedent", "insert"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "indent":
            lines[i] = "    " + lines[i]
        elif op == "dedent":
            lines[i] = lines[i][4:] if lines[i].startswith("    ") else lines[i].lstrip(" ")
        else:
            indent = re.match(r"[ \t]*", lines[i]).group()
            lines.insert(i, indent + draw(st.sampled_from(TOKENS)) + "\n")
    return "".join(lines)


@settings(max_examples=10, **SETTINGS)
@given(mutated_fixture())
def test_mutated_fixtures(text):
    assume(_parses(text))
    check_all(text)


@pytest.mark.parametrize("path", FIXTURES[::8], ids=lambda p: p.name)
def test_unmutated_fixtures(path):
    check_all(path.read_text())


# ----- (b) hypothesmith-generated programs -------------------------------------------------------
def _hypothesmith():
    return pytest.importorskip("hypothesmith")


@pytest.fixture(scope="module")
def grammar_strategy():
    return _hypothesmith().from_grammar()


def test_generated_programs(grammar_strategy):
    @settings(max_examples=20, **SETTINGS)
    @given(grammar_strategy)
    def run(program):
        text = "import torch\n" + program
        assume(_parses(text))
        check_all(text)

    run()
