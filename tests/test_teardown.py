"""A converted script ends cleanly: gloo must not abort a rank at interpreter exit after the work is done.

The abort ('terminate called without an active exception', SIGABRT; bench/bench_teardown.py has the
core dump's account) comes from a DDP wrapper's gradient all-reduces, which hold Python state,
being released during interpreter finalization. The generated cleanup_distributed() releases
them while Python still runs: every wrapper, held (here by a trainer object at module level,
fixtures/trainer_class.py) or garbage in reference cycles, drops its reducer, and the cycles are collected. A probe at exit
counts the wrappers still holding one (none may): it fails whenever a wrapper keeps its reducer, whether
or not gloo happens to abort in that run. Here the ranks are the test fork server's, whose interpreters
skip finalization. The real torchrun's, which finalize as a user's do, run the probe in
tests/test_launch.py's two-node launch: a script in the same style (a trainer bound at module level holds
the wrapper), the probe and a clean end on all four ranks (bench/bench_teardown.py repeats such launches in
parallel to widen the race).
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


def test_no_wrapper_holds_its_all_reduces_after_cleanup(converted: Path):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(converted)]
    run = run_script(argv, converted.parent, timeout=180)
    assert run.returncode == 0, failure_report(run)
    assert PROBED.findall(run.stderr) == ["0", "0"], failure_report(run)
    assert "done after 8 steps" in run.stdout  # 16 steps, half on each rank
