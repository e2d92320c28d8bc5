"""Lint every script of the lint corpus (build/, see rebuild.py) with the default rules and with
every rule (`--select ALL`), and write the findings as JSON for triage (docs/lint-precision.md).

    python bench/lint_corpus/run.py [--out build/findings.json]

Each finding: entry, repository path, the script's kind (as ddpify sees it), rule code and name,
severity, whether the rule is on by default, line and message. Per selection, the findings per
rule and the files with errors.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from ddpify.anatomy import analyze
from ddpify.lint.config import ALL_SELECTOR, Config
from ddpify.lint.engine import Options, lint_file
from ddpify.lint.registry import all_rules

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"
SELECTIONS = {"default": None, "all": (ALL_SELECTOR,)}


def lint_corpus(entries: list[dict], select: tuple[str, ...] | None) -> dict:
    """The findings of one selection over every entry, and the errors."""
    options = Options(config=Config(select=select))
    default_on = {rule.code: rule.default_enabled for rule in all_rules()}
    findings, errors = [], []
    for entry in entries:
        path = BUILD / f"{entry['name']}.py"
        report = lint_file(str(path), options)
        errors += report.errors
        kind = analyze(path.read_text(), str(path)).kind.value
        findings += [
            {"entry": entry["name"], "source": f"{entry['repo']}:{entry['path']}", "kind": kind, "code": d.code, "name": d.name,
             "severity": d.severity, "default_on": default_on[d.code], "line": d.pos.line, "message": d.message}
            for d in report.diagnostics
        ]
    per_rule = Counter(f["code"] for f in findings)
    return {"scripts": len(entries), "findings": findings, "per_rule": dict(sorted(per_rule.items())), "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUILD / "findings.json")
    options = parser.parse_args()
    entries = json.loads((HERE / "manifest.json").read_text())["entries"]
    missing = [e["name"] for e in entries if not (BUILD / f"{e['name']}.py").is_file()]
    if missing:
        raise SystemExit(f"not built: {', '.join(missing)} (run bench/lint_corpus/rebuild.py)")
    results = {name: lint_corpus(entries, select) for name, select in SELECTIONS.items()}
    options.out.write_text(json.dumps(results, indent=1) + "\n")
    for name, result in results.items():
        print(f"{name}: {len(result['findings'])} findings in {result['scripts']} scripts, {len(result['errors'])} errors; {result['per_rule']}")


if __name__ == "__main__":
    main()
