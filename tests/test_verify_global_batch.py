"""A script that writes its batch size into a shape (`x.reshape(batch_size, -1)`) cannot take the batch verify
re-cuts for the reference (N ranks x batch). Where the script sets its batch as a module-level constant or an
argparse option, verify runs the reference again with N times that batch written there and says so; a batch
it cannot set (a literal in the shape) stays a one-line "could not run" (tests/test_verify.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify  # noqa: E402

from ddpify.verify.plan import ScriptBatch  # noqa: E402
from ddpify.verify.script_batch import script_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).resolve().parent / "verify_cases"
SUBPROCESS_TIMEOUT_S = 240


def verify_case(*args: str) -> tuple[int, dict]:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = run_ddpify(["verify", "--json", *args], CASES, env, SUBPROCESS_TIMEOUT_S)
    assert completed.stdout.startswith("{"), completed.stderr[-3000:]
    return completed.returncode, json.loads(completed.stdout)


@pytest.mark.parametrize("case, args, where, batch", [
    ("hardcoded_batch.py", (), "`batch_size = 8` at hardcoded_batch.py:6", 8),
    ("option_batch.py", ("--", "--batch-size", "4"), "`--batch-size` (option_batch.py:11)", 4),
])
def test_a_batch_size_the_script_sets_is_set_to_the_global_batch_for_the_reference(case, args, where, batch):
    code, result = verify_case(case, "--to", "ddp", "--steps", "4", *args)
    assert (code, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]
    retried = next(note for note in result["notes"] if note.startswith("the reference failed on the batch verify re-cut"))
    assert retried.startswith(f"the reference failed on the batch verify re-cut for it (2 ranks x {batch}: RuntimeError: ")
    assert retried.endswith(f"it ran again with the global batch set where the script sets it, {where} made "
                                       f"{2 * batch}, each step re-cut as 2 ranks x {batch}")


def test_where_a_script_sets_its_batch():
    assert script_batch(str(CASES / "hardcoded_batch.py"), ()) == ScriptBatch("`batch_size = 8` at hardcoded_batch.py:6", 8, 6, 13, 14)
    assert script_batch(str(CASES / "option_batch.py"), ("--batch-size=4",)).value == 4
    assert script_batch(str(CASES / "option_batch.py"), ()).value == 16
    assert script_batch(str(CASES / "literal_batch.py"), ()) is None


def test_the_global_batch_is_written_where_the_script_sets_it():
    constant = ScriptBatch("", 8, 2, 13, 14)
    assert constant.source("import torch\nbatch_size = 8  # per step\n", 2) == "import torch\nbatch_size = 16  # per step\n"
    option = ScriptBatch("", 4, option="--batch-size")
    assert option.argv(("--batch-size", "4", "--epochs", "1"), 3) == ("--batch-size", "12", "--epochs", "1")
    assert option.argv(("--batch-size=4",), 2) == ("--batch-size=8",)
    assert option.argv(("--epochs", "1"), 2) == ("--epochs", "1", "--batch-size", "8")
