"""What verify records at each optimizer step of a script that steps several optimizers (a GAN's generator
and discriminator): every optimizer's parameters, measured against where training started."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_ddpify  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).resolve().parent / "verify_cases"
SUBPROCESS_TIMEOUT_S = 240


def test_the_steps_of_a_second_optimizer_are_measured_against_the_training_so_far():
    """The second Adam's pre-BatchNorm bias has a gradient of float noise only, which Adam turns into
    whole-sized updates of those two elements: within 1e-2 of the update, as on the first optimizer's steps.
    (Its steps were once measured on its own parameters against the first optimizer's initial ones: shapes
    that differ, no Δparam/update, and a divergence at step 2.)"""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = run_ddpify(["verify", "two_optimizers.py", "--to", "ddp", "--steps", "6", "--json"], CASES, env, SUBPROCESS_TIMEOUT_S)
    result = json.loads(completed.stdout)
    assert (completed.returncode, result["verdict"], result["mode"]) == (0, "equivalent", "exact"), result["message"]
    assert all(step["update_rel_param"] is not None for step in result["steps"]), result["steps"]
    assert max(step["max_rel_param"] for step in result["steps"]) > 1e-5, "no noise amplified: the case proves nothing"
