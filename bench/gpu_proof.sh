#!/usr/bin/env bash
# GPU proof (issue 12): on a machine with one CUDA GPU, convert every fixture, run the DDP output
# under torchrun with NCCL (1 rank) and with 2 ranks sharing the GPU (gloo on CUDA tensors), run
# `ddpify verify --device cuda`, run the DataParallel output on the GPU, check SyncBatchNorm,
# AMP (fp16 + GradScaler, bf16 autocast), hard-coded cuda:N and a model moved in a constructor,
# and write a Markdown table. Never part of CI. Takes under 9 minutes: no step starts after
# --budget seconds (default 480), each step has its own `timeout`, the whole run one of 540 s.
#
#   bash bench/gpu_proof.sh [OUT.md] [--jobs N] [--only FIXTURE...] [--workdir DIR] [--budget S]
#
# Needs ddpify installed for $PYTHON (default python3): `pip install -e .` or a wheel.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/docs/gpu-proof.md}
shift $(( $# > 0 ? 1 : 0 ))
py=${PYTHON:-python3}

# Checked from / so that the checkout's own ddpify/ (without ddpify.rules) is not what gets imported.
if ! (cd / && timeout 60 "$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'); then
    echo "gpu_proof: torch sees no CUDA GPU here; nothing to prove" >&2
    exit 2
fi
if ! (cd / && timeout 60 "$py" -c 'import ddpify.cli, ddpify.rules' 2>/dev/null); then
    echo "gpu_proof: ddpify is not installed for $py (pip install -e $root first)" >&2
    exit 2
fi
mkdir -p "$(dirname "$out")"
exec timeout -k 10 540 "$py" "$root/bench/gpu_proof.py" "$out" "$@"
