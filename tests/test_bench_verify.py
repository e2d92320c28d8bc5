"""bench/run_converted.py --verify: `ddpify verify` of every fixture whose conversion completes, per target, counted
(complete conversions, verify equivalent), each verify bounded and killed with everything it started."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify  # noqa: E402
from test_converted_runs import bench  # noqa: E402


def verify_forked(command: list, cwd: Path, env: dict, timeout: float):
    """The bench's `python -m ddpify verify ...` launch, forked by the tests' fork server (a real one starts a
    launcher that imports torch: ~4 CPU-s; the real launch path is the next test's)."""
    assert command[1:3] == ["-m", "ddpify"], command
    return run_ddpify(command[3:], cwd, env, timeout)


def test_verify_counts_complete_conversions_and_their_verdicts_per_target(tmp_path, monkeypatch, capsys):
    out = tmp_path / "verify.json"
    monkeypatch.setattr(bench, "run_real", verify_forked)
    monkeypatch.setattr(sys, "argv", ["run_converted.py", "--only", "real/weighted_sampler", "--targets", "accelerate", "ddp",
                                      "--verify", "--steps", "2", "--json", str(out)])
    bench.main()
    printed = capsys.readouterr().out
    assert "accelerate: 1 of 1 complete, 1 of 1 verify equivalent\n" in printed, printed
    assert "ddp: 0 of 1 complete, 0 of 0 verify equivalent\n" in printed, printed  # incomplete: not verified
    written = json.loads(out.read_text())
    assert [(o["target"], o["status"]) for o in written["outcomes"]] == [("accelerate", "equivalent"), ("ddp", "incomplete")]
    assert written["outcomes"][0]["detail"].startswith("equivalent: 2 steps match")
    assert written["counts"]["accelerate"]["equivalent"] == 1 and written["counts"]["ddp"]["complete"] == 0


def test_a_verify_that_outlives_its_timeout_is_killed_and_counted(tmp_path, monkeypatch):
    mark = f"DDPIFY_TEST_MARK={uuid.uuid4().hex}"  # every process the verify starts inherits it
    monkeypatch.setenv(*mark.split("="))
    entry = bench.entries(["basic_main"])[0]
    outcome = bench.verify_one(entry, "ddp", tmp_path, bench.run_real, timeout=2.0)  # verify alone imports torch twice
    assert (outcome.status, outcome.detail) == ("timeout", "still running after 2 s")
    assert bench.verify_summary("ddp", bench.verify_counts([outcome], "ddp")) == \
        "ddp: 1 of 1 complete, 0 of 1 verify equivalent (timeout 1)"
    assert processes_marked(mark) == [], "run_real left processes of the verify running"


def processes_marked(mark: str) -> list[int]:
    """The processes whose environment holds `mark`."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:  # gone, or not ours
            continue
    return found
