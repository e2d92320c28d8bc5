"""GPU-only checks (marked `gpu`): they skip where torch sees no CUDA GPU, which includes CI.

The full proof is `bash bench/gpu_proof.sh` (table in docs/gpu-proof.md); the test here runs it
on the fixtures whose GPU-only traps it exists for. Without a GPU, only the script's refusal
is checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

try:
    from helpers import failure_report, run_script
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import failure_report, run_script

ROOT = Path(__file__).resolve().parents[1]
PROOF = ROOT / "bench" / "gpu_proof.sh"
GPU_TRAPS = ["batchnorm_cnn", "amp_gradscaler", "amp_bf16_autocast", "trainer_class", "helper_functions"]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without a GPU")
def test_the_gpu_proof_refuses_to_run_without_a_gpu(tmp_path):
    result = run_script(["bash", PROOF, tmp_path / "proof.md"], cwd=tmp_path, env_extra={"CUDA_VISIBLE_DEVICES": ""},
                        timeout=120)
    assert result.returncode == 2, failure_report(result)
    assert "torch sees no CUDA GPU" in result.stderr
    assert not (tmp_path / "proof.md").exists()


@pytest.mark.gpu
@needs_cuda
def test_gpu_traps_pass_the_proof(tmp_path):
    out = tmp_path / "proof.md"
    result = run_script(["bash", PROOF, out, "--only", *GPU_TRAPS, "--workdir", tmp_path / "work", "--budget", "240"],
                        cwd=tmp_path, env_extra={"PYTHON": sys.executable}, timeout=560)
    table = out.read_text() if out.exists() else ""
    assert result.returncode == 0 and "| FAIL |" not in table, failure_report(result) + table
    for check in ("SyncBatchNorm ws2 gloo", "AMP fp16 + GradScaler", "bf16 autocast", "hard-coded cuda:N",
                  "model moved in constructor"):
        assert f"| {check} | pass |" in table, check
