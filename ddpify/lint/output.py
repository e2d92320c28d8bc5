"""Print findings as text (full, or concise: one line each), JSON, GitHub Actions workflow
commands or SARIF 2.1.0; or, with --statistics, a count per rule.

Positions are printed 1-based for lines and columns; an end column is the column just past the
last character (exclusive), as in SARIF.

Notebooks (.ipynb) are linted as the script of their joined code cells (ddpify.notebooks). Text
output names a finding by cell, `nb.ipynb:cell 4:line 2: CODE message` (cells counted from 1,
markdown included); JSON adds `"cell": 4` and gives `line`/`end_line` within that cell (plus
`script_line`, the joined-script line). GitHub and SARIF have no notion of cells: they carry the
joined-script line (the line in `notebook_to_script`'s text), and fix edits everywhere use it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote
from typing import Callable, Sequence

from ddpify import __version__
from ddpify.lint.docs import kinds_text, render_rule, rule_doc
from ddpify.lint.engine import Diagnostic
from ddpify.lint.rule import Edit, Fix, Rule

FORMATS = ("concise", "full", "text", "json", "github", "sarif")
TEXT_FORMATS = ("concise", "full", "text")  # "text" is the name "full" had first
_GITHUB_LEVELS = {"error": "error", "warning": "warning", "info": "notice"}
_SARIF_LEVELS = {"error": "error", "warning": "warning", "info": "note"}
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


def render(fmt: str, diagnostics: Sequence[Diagnostic], rules: Sequence[type[Rule]], errors: Sequence[str]) -> str:
    """The findings in format `fmt`; `rules` describe the tool (SARIF), `errors` its failures."""
    if fmt in TEXT_FORMATS:
        return "".join("".join(piece for piece, _ in diagnostic_parts(fmt, d)) for d in diagnostics)
    if fmt == "json":
        return json.dumps([json_diagnostic(d) for d in diagnostics], indent=2) + "\n"
    if fmt == "github":
        return "".join(f"{github_command(d)}\n" for d in diagnostics)
    if fmt == "sarif":
        return json.dumps(sarif_log(diagnostics, rules, errors), indent=2) + "\n"
    raise ValueError(f"unknown output format {fmt!r}")


# ----- text -------------------------------------------------------------------------------------
def diagnostic_parts(fmt: str, d: Diagnostic) -> list[tuple[str, str | None]]:
    """One diagnostic in a text format, as (text, role) pieces ending with a newline."""
    return concise_parts(d) if fmt == "concise" else text_parts(d) + [("\n", None)]


def concise_parts(d: Diagnostic) -> list[tuple[str, str | None]]:
    """`path:line:col: CODE [*] message` on one line; `[*]` marks a safe fix."""
    where = d.location if d.location is not None else f"{d.pos.line}:{d.pos.col + 1}"
    mark = " [*]" if d.fix is not None and d.fix.safe else ""
    return [(d.path, "path"), (f":{where}: ", None), (d.code, f"severity-{d.severity}"), (f"{mark} {d.message}\n", None)]


def text_diagnostic(d: Diagnostic) -> str:
    """`path:line:col: CODE message` (notebooks: `path:cell N:line M: CODE message`), then the
    source line with a caret under the range."""
    return "".join(text for text, _ in text_parts(d))


def text_parts(d: Diagnostic) -> list[tuple[str, str | None]]:
    """The text of a diagnostic as (text, role) pieces; role names what a terminal may colour:
    "path", "code", "severity-<level>" or None. Joined, the pieces are `text_diagnostic(d)`."""
    where = d.location if d.location is not None else f"{d.pos.line}:{d.pos.col + 1}"
    line = d.cell_line if d.cell_line is not None else d.pos.line
    gutter = str(line)
    blank = " " * len(gutter)
    frame = f" {gutter} | {d.source_line}\n {blank} | {_caret(d)}"
    if d.fix is not None:
        frame += f"\n {blank} = fix ({'safe' if d.fix.safe else 'unsafe'}): {d.fix.description}"
    return [(d.path, "path"), (f":{where}: ", None), (d.code, f"severity-{d.severity}"),
            (f" {d.message}\n{frame}\n", None)]


def _caret(d: Diagnostic) -> str:
    line = d.source_line
    indent = "".join(ch if ch == "\t" else " " for ch in line[: d.pos.col])
    end = d.pos.end_col if d.pos.end_line == d.pos.line else len(line.rstrip())
    return indent + "^" * max(1, end - d.pos.col)


# ----- statistics -------------------------------------------------------------------------------
def statistics(fmt: str, diagnostics: Sequence[Diagnostic], fixable: Callable[[Fix | None], bool]) -> str:
    """Findings counted per rule, most first: `  3  DDP007  [*] log-on-every-rank` rows, or JSON."""
    rows = _statistics_rows(diagnostics, fixable)
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    width = max((len(str(r["count"])) for r in rows), default=1)
    code_width = max((len(r["code"]) for r in rows), default=1)
    return "".join(f"{r['count']:>{width}}\t{r['code']:<{code_width}}\t{'[*]' if r['fixable'] else '   '} {r['name']}\n" for r in rows)


def _statistics_rows(diagnostics: Sequence[Diagnostic], fixable: Callable[[Fix | None], bool]) -> list[dict]:
    by_code: dict[str, list[Diagnostic]] = {}
    for d in diagnostics:
        by_code.setdefault(d.code, []).append(d)
    rows = [{"code": code, "name": found[0].name, "count": len(found), "fixable": any(fixable(d.fix) for d in found)}
            for code, found in by_code.items()]
    return sorted(rows, key=lambda r: (-r["count"], r["code"]))


# ----- json -------------------------------------------------------------------------------------
def json_diagnostic(d: Diagnostic) -> dict:
    where = _json_range(d.pos.line, d.pos.col, d.pos.end_line, d.pos.end_col)
    if d.cell is not None:  # a notebook: lines within the cell, the joined-script line kept
        shift = d.cell_line - d.pos.line
        where = {"cell": d.cell, **where, "line": d.cell_line, "end_line": d.pos.end_line + shift, "script_line": d.pos.line}
    return {
        "path": d.path,
        **where,
        "code": d.code,
        "name": d.name,
        "message": d.message,
        "severity": d.severity,
        "fix": _json_fix(d.fix),
    }


def _json_range(line: int, col: int, end_line: int, end_col: int) -> dict:
    return {"line": line, "column": col + 1, "end_line": end_line, "end_column": end_col + 1}


def _json_fix(fix: Fix | None) -> dict | None:
    if fix is None:
        return None
    edits = [{**_json_range(e.line, e.col, e.end_line, e.end_col), "text": e.text} for e in fix.edits]
    return {"safe": fix.safe, "description": fix.description, "edits": edits}


# ----- github -----------------------------------------------------------------------------------
def github_command(d: Diagnostic) -> str:
    """A GitHub Actions `::error ...::message` workflow command (warning/notice by severity)."""
    props = {
        "file": d.path,
        "line": d.pos.line,
        "col": d.pos.col + 1,
        "endLine": d.pos.end_line,
        "endColumn": d.pos.end_col + 1,
        "title": f"{d.code} {d.name}",
    }
    listed = ",".join(f"{k}={_escape_property(str(v))}" for k, v in props.items())
    return f"::{_GITHUB_LEVELS.get(d.severity, 'error')} {listed}::{_escape_data(d.message)}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


# ----- sarif ------------------------------------------------------------------------------------
def sarif_log(diagnostics: Sequence[Diagnostic], rules: Sequence[type[Rule]], errors: Sequence[str]) -> dict:
    """A SARIF 2.1.0 log with one run: the rules as the driver's rules, one result per finding."""
    index = {r.code: i for i, r in enumerate(rules)}
    driver = {"name": "ddpify", "version": __version__, "rules": [_sarif_rule(r) for r in rules]}
    invocation = {
        "executionSuccessful": not errors,
        "toolExecutionNotifications": [{"level": "error", "message": {"text": e}} for e in errors],
    }
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": driver},
                "invocations": [invocation],
                "columnKind": "unicodeCodePoints",
                "results": [_sarif_result(d, index) for d in diagnostics],
            }
        ],
    }


def _sarif_rule(rule: type[Rule]) -> dict:
    doc = rule_doc(rule)
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.message},
        "fullDescription": {"text": doc.sections.get("What it does") or doc.summary or rule.message},
        "help": {"text": render_rule(rule), "markdown": render_rule(rule)},
        "defaultConfiguration": {"level": _SARIF_LEVELS[rule.severity], "enabled": rule.default_enabled},
        "properties": {"tags": kinds_text(rule).split(", ")},
    }


def _sarif_result(d: Diagnostic, index: dict[str, int]) -> dict:
    uri = _uri(d.path)
    result = {
        "ruleId": d.code,
        "level": _SARIF_LEVELS.get(d.severity, "error"),
        "message": {"text": d.message},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": uri}, "region": _region(d.pos.line, d.pos.col, d.pos.end_line, d.pos.end_col)}}],
    }
    if d.code in index:
        result["ruleIndex"] = index[d.code]
    if d.fix is not None:
        result["fixes"] = [_sarif_fix(d.fix, uri)]
    return result


def _sarif_fix(fix: Fix, uri: str) -> dict:
    replacements = [_sarif_replacement(e) for e in fix.edits]
    return {"description": {"text": fix.description}, "artifactChanges": [{"artifactLocation": {"uri": uri}, "replacements": replacements}]}


def _sarif_replacement(edit: Edit) -> dict:
    return {"deletedRegion": _region(edit.line, edit.col, edit.end_line, edit.end_col), "insertedContent": {"text": edit.text}}


def _region(line: int, col: int, end_line: int, end_col: int) -> dict:
    return {"startLine": line, "startColumn": col + 1, "endLine": end_line, "endColumn": end_col + 1}


def _uri(path: str) -> str:
    """A relative path as a relative URI reference (posix separators), an absolute one as file://."""
    p = Path(path)
    return p.as_uri() if p.is_absolute() else quote(p.as_posix())
