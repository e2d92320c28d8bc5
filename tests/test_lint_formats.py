"""`ddpify lint --output-format text|json|github|sarif`."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from ddpify.anatomy import Pos
from ddpify.cli import cli
from ddpify.lint.engine import Diagnostic
from ddpify.lint.output import github_command, render
from ddpify.lint.registry import all_rules
from ddpify.lint.rule import Edit, Fix

SARIF_SCHEMA = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"
SCRIPT = (
    "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
    "device = torch.device('cuda', 0)\nstate = torch.load('ckpt.pt')\n"
)


@pytest.fixture
def script(tmp_path, monkeypatch) -> str:
    """A DDP script with one DDP001 finding (6:9-6:30), linted by its relative path."""
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text(SCRIPT)
    return "train.py"


def lint_output(fmt: str, *paths: str) -> str:
    result = CliRunner().invoke(cli, ["lint", "--select", "DDP001", "--output-format", fmt, *paths])
    assert result.exit_code == 1, result.output
    return result.stdout


def diagnostic(severity: str = "error", message: str = "m") -> Diagnostic:
    return Diagnostic("a, b.py", "DDP001", "name", message, severity, Pos(2, 0, 3, 4), None, "x = 1")


def test_text(script):
    assert lint_output("text", script) == (
        "train.py:6:9: DDP001 torch.load() without map_location loads every rank's copy onto the GPU it was"
        " saved from (usually cuda:0)\n"
        " 6 | state = torch.load('ckpt.pt')\n"
        "   |         ^^^^^^^^^^^^^^^^^^^^^\n"
        "   = fix (safe): Add map_location=device\n\n"
    )


def test_text_caret_follows_tabs_and_stops_at_the_line_end():
    d = Diagnostic("p.py", "DDP001", "n", "m", "error", Pos(1, 2, 3, 0), None, "\tx = f(")
    assert render("text", [d], [], []).splitlines()[2] == "   | \t ^^^^^"


def test_json(script):
    [item] = json.loads(lint_output("json", script))
    assert item == {
        "path": "train.py",
        "line": 6,
        "column": 9,
        "end_line": 6,
        "end_column": 30,
        "code": "DDP001",
        "name": "torch-load-without-map-location",
        "message": all_rules()[0].message,
        "severity": "error",
        "fix": {
            "safe": True,
            "description": "Add map_location=device",
            "edits": [{"line": 6, "column": 29, "end_line": 6, "end_column": 29, "text": ", map_location=device"}],
        },
    }


def test_json_empty_is_an_empty_array():
    assert render("json", [], [], []) == "[]\n"


def test_github(script):
    assert lint_output("github", script) == (
        "::error file=train.py,line=6,col=9,endLine=6,endColumn=30,title=DDP001 torch-load-without-map-location"
        "::torch.load() without map_location loads every rank's copy onto the GPU it was saved from (usually cuda:0)\n"
    )


@pytest.mark.parametrize(("severity", "command"), [("error", "::error "), ("warning", "::warning "), ("info", "::notice ")])
def test_github_severity_and_escaping(severity, command):
    line = github_command(diagnostic(severity, "50% done\nnext"))
    assert line.startswith(command + "file=a%2C b.py,line=2,col=1,endLine=3,endColumn=5,title=DDP001 name::")
    assert line.endswith("::50%25 done%0Anext")


def test_sarif_is_valid_and_complete(script):
    log = json.loads(lint_output("sarif", script))
    validate_sarif(log)
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.code for r in all_rules()]
    assert all(r["name"] and r["shortDescription"]["text"] and r["fullDescription"]["text"] for r in rules)
    [result] = run["results"]
    assert result["ruleId"] == "DDP001" and result["level"] == "error"
    assert rules[result["ruleIndex"]]["id"] == "DDP001"
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "train.py"
    assert location["region"] == {"startLine": 6, "startColumn": 9, "endLine": 6, "endColumn": 30}
    assert result["fixes"][0]["artifactChanges"][0]["replacements"][0]["insertedContent"]["text"] == ", map_location=device"
    assert run["invocations"] == [{"executionSuccessful": True, "toolExecutionNotifications": []}]


def test_sarif_reports_errors_and_levels_and_absolute_uris(tmp_path):
    diagnostics = [diagnostic("warning"), diagnostic("info")]
    absolute = Diagnostic(str(tmp_path / "x y.py"), "DDP001", "n", "m", "error", Pos(1, 0, 1, 1),
                          Fix((Edit(1, 0, 1, 1, "z"),), False, "d"), "x")
    log = json.loads(render("sarif", [*diagnostics, absolute], all_rules(), ["bad.py:3: syntax error"]))
    validate_sarif(log)
    run = log["runs"][0]
    assert [r["level"] for r in run["results"]] == ["warning", "note", "error"]
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "a%2C%20b.py"
    assert run["results"][2]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("file:///")
    assert run["invocations"][0]["executionSuccessful"] is False
    assert run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"] == "bad.py:3: syntax error"


def validate_sarif(log: dict) -> None:
    schema = json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(log)
