"""action.yml: a composite GitHub Action; its ddpify `run:` steps are run here as the runner would."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
EXPR = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def _inputs(**overrides):
    values = {name: spec.get("default", "") for name, spec in ACTION["inputs"].items()}
    values.update(overrides)
    return values


def _substitute(script, inputs, outputs):
    def value(match):
        expr = match.group(1)
        if expr.startswith("inputs."):
            return str(inputs[expr[len("inputs."):]])
        if expr == "github.action_path":
            return str(ROOT)
        step = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
        if step:
            return outputs.get(step.group(1), {}).get(step.group(2), "")
        raise AssertionError(f"the test does not know the expression {expr!r}")

    return EXPR.sub(value, script)


def _run_steps(tmp_path, **overrides):
    """Run every ddpify `run:` step (the install step needs the network; `uses:` steps need GitHub)."""
    inputs = _inputs(**overrides)
    outputs: dict[str, dict[str, str]] = {}
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    results = []
    for step in ACTION["runs"]["steps"]:
        if "uses" in step or "pip install" in step["run"]:
            continue
        assert step["shell"] == "bash"
        output_file = tmp_path / f"output-{len(results)}"
        output_file.write_text("")
        script = _substitute(step["run"], inputs, outputs)
        # GitHub runs `shell: bash` as `bash --noprofile --norc -eo pipefail {0}`
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=tmp_path,
                              env=dict(env, GITHUB_OUTPUT=str(output_file)), capture_output=True, text=True)
        if "id" in step:
            outputs[step["id"]] = dict(line.split("=", 1) for line in output_file.read_text().splitlines() if "=" in line)
        results.append((step["name"], done))
        if done.returncode:
            break
    return results


def test_action_shape():
    assert ACTION["runs"]["using"] == "composite"
    assert ACTION["inputs"]["torch-version"]["default"] == "2.13.0"
    steps = ACTION["runs"]["steps"]
    install = next(s for s in steps if "run" in s and "pip install" in s["run"])
    assert 'torch==${{ inputs.torch-version }}' in install["run"] and "download.pytorch.org/whl/cpu" in install["run"]
    assert "${{ github.action_path }}" in install["run"]
    upload = next(s for s in steps if s.get("uses", "").startswith("github/codeql-action/upload-sarif@"))
    assert upload["with"]["sarif_file"] == "${{ inputs.sarif-file }}"
    for step in steps:
        assert "uses" in step or step.get("shell") == "bash"  # composite run steps must name a shell


def test_findings_annotate_write_sarif_and_fail(tmp_path):
    results = _run_steps(tmp_path, paths=str(ROOT / "fixtures" / "lint" / "ddp"))
    names = [name for name, _ in results]
    assert names == ["Lint (annotations)", "Lint (SARIF)", "Fail on findings"]
    annotate, sarif_step, fail = (done for _, done in results)
    assert annotate.returncode == 0 and re.search(r"^::(error|warning|notice) file=", annotate.stdout, re.M)
    assert sarif_step.returncode == 0
    sarif = json.loads((tmp_path / "ddpify.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"]
    assert fail.returncode == 1 and "ddpify found problems" in fail.stdout


def test_findings_do_not_fail_when_asked(tmp_path):
    results = _run_steps(tmp_path, paths=str(ROOT / "fixtures" / "lint" / "ddp"), **{"fail-on-findings": "false"})
    assert all(done.returncode == 0 for _, done in results) and len(results) == 3


def test_clean_code(tmp_path):
    results = _run_steps(tmp_path, paths=str(ROOT / "fixtures" / "clean"), **{"sarif-file": "clean.sarif"})
    assert all(done.returncode == 0 for _, done in results) and len(results) == 3
    assert json.loads((tmp_path / "clean.sarif").read_text())["runs"][0]["results"] == []


def test_ddpify_errors_fail_the_step(tmp_path):
    results = _run_steps(tmp_path, paths=str(tmp_path / "missing.py"))
    assert results[0][1].returncode != 0 and len(results) == 1
