"""Every hang report that waits out a timeout on purpose, run side by side: verify's three (tests/test_verify.py:
rank 0 alone in a barrier under forked ranks and under the real torchrun, an all_reduce one rank never joins) and the
converted-runs bench's report of a hung rank under the real torchrun (tests/test_converted_runs.py). Each check is
defined beside what it tests. One after another they kept a worker idle for ~21 s; side by side they take about the
longest one's time (~15 s). Every report is checked; a failure names its report."""

from __future__ import annotations

import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_converted_runs import a_hung_rank_is_reported_with_its_stack  # noqa: E402
from test_verify import HANG_REPORTS  # noqa: E402

# The bench's first launch waits as long as verify's torchrun report takes anyway, so that a slow start under the
# others' load is not tried again (its ranks dump a second after they start; alone, 6 s was enough).
BENCH_HANG_TIMEOUTS_S = (15, 40)


def test_hangs_are_reported_where_they_happen_and_leave_no_process_behind(tmp_path):
    checks = {**HANG_REPORTS, "a hung rank under the real torchrun, bench/run_converted.py":
              lambda: a_hung_rank_is_reported_with_its_stack(tmp_path, BENCH_HANG_TIMEOUTS_S)}
    with ThreadPoolExecutor(len(checks)) as pool:
        runs = {name: pool.submit(check) for name, check in checks.items()}
    failed = {name: run.exception() for name, run in runs.items() if run.exception() is not None}
    assert not failed, "\n\n".join(f"--- {name}:\n" + "".join(traceback.format_exception(error)) for name, error in failed.items())
