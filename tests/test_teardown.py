"""A converted script ends cleanly: gloo must not abort a rank at interpreter exit after the work is done.

The abort ('terminate called without an active exception', SIGABRT; bench/bench_teardown.py has the
core dump's account) comes from a DDP wrapper's gradient all-reduces, which hold Python state,
being released during interpreter finalization. The generated cleanup_distributed() releases
them while Python still runs: the wrappers in cycles are collected, and those still held (here by
a trainer object at module level, fixtures/trainer_class.py) drop their reducer. A probe at exit
counts the wrappers still holding one (none may): it fails whenever a wrapper keeps its reducer, whether
or not gloo happens to abort in that run. The script then runs once under the real torchrun, whose
interpreters finalize as a user's do (the test fork server's skip that): the probe and a clean end on
both ranks (bench/bench_teardown.py repeats such launches in parallel to widen the race).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ddpify.convert import convert_source
from helpers import failure_report, run_script

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trainer_class.py"
PROBE = '''

def _wrappers_holding_all_reduces():
    import gc, sys, torch
    gc.collect()
    held = [w for w in gc.get_objects() if isinstance(w, torch.nn.parallel.DistributedDataParallel) and w.reducer is not None]
    print(f"wrappers holding all-reduces at exit: {len(held)}", file=sys.stderr)


__import__("atexit").register(_wrappers_holding_all_reduces)
'''
PROBED = re.compile(r"wrappers holding all-reduces at exit: (\d+)")
TEARDOWN_ABORT = "terminate called without an active exception"


@pytest.fixture
def converted(tmp_path: Path) -> Path:
    """fixtures/trainer_class.py converted, with the probe: its Trainer, bound at module level, holds the wrapper."""
    script = tmp_path / "trainer_class_ddp.py"
    script.write_text(convert_source(FIXTURE.read_text(), "ddp", path=str(FIXTURE)).output + PROBE)
    return script


def torchrun(script: Path, real: bool) -> list[str]:
    """argv of a 2-rank torchrun of `script`: through the tests' fork server, or (`real`) torchrun itself
    (`-c`: a launch the fork server does not take)."""
    launcher = ["-c", "from torch.distributed.run import main; main()"] if real else ["-m", "torch.distributed.run"]
    return [sys.executable, *launcher, "--standalone", "--nproc_per_node=2", str(script)]


def test_no_wrapper_holds_its_all_reduces_after_cleanup(converted: Path):
    run = run_script(torchrun(converted, real=False), converted.parent, timeout=180)
    assert run.returncode == 0, failure_report(run)
    assert PROBED.findall(run.stderr) == ["0", "0"], failure_report(run)


def test_the_converted_script_ends_cleanly_under_the_real_torchrun(converted: Path):
    run = run_script(torchrun(converted, real=True), converted.parent, timeout=300)
    assert run.returncode == 0 and TEARDOWN_ABORT not in run.stderr, failure_report(run)
    assert PROBED.findall(run.stderr) == ["0", "0"], failure_report(run)
    assert "done after 8 steps" in run.stdout  # 16 steps, half on each rank
