#!/usr/bin/env bash
# A lent GPU machine's checks in one bounded command (issue 26's GPU rows, then the GPU proof), for
# the device tool's bare image (python3 with torch; ddpify's other dependencies carried as wheels in
# .whl/, see docs/gpu-proof.md). Every phase has its own timeout and writes into OUTDIR as it goes,
# so what finished comes back even when a later phase runs out of time: the GPU proof first (about
# 260 s for every fixture with 16 jobs on an H200), then the benchmark, 7 rounds at one rank (about
# 110 s) and 5 at two ranks sharing the GPU (about 90 s). At most 590 s; a session has 900 s of
# device time, the machine's start included.
#
#   bash bench/gpu_session.sh OUTDIR
set -uo pipefail
out=${1:?usage: bash bench/gpu_session.sh OUTDIR}
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
ln -sfn ../rules ddpify/rules  # as the wheel lays it out
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version(), "Python", sys.version.split()[0])'
  nproc; } > "$out/machine.txt" 2>&1
PYTHON=python3 OMP_NUM_THREADS=1 timeout -k 5 300 bash bench/gpu_proof.sh "$out/gpu-proof.md" \
    --workdir /tmp/gp --jobs 16 --budget 230 > "$out/gpu-proof.log" 2>&1
rows="cnn-batchnorm transformer-lm gan-two-models amp-gradscaler grad-accumulation sharded-eval fsdp2-transformer"
# shellcheck disable=SC2086
timeout -k 5 170 python3 bench/bench_overhead.py --device cuda --nproc 1 --repeat 7 --budget 100 --only $rows \
    > "$out/overhead-cuda-1rank.txt" 2>&1
timeout -k 5 110 python3 bench/bench_overhead.py --device cuda --nproc 2 --share-gpu --repeat 5 --budget 60 \
    --only cnn-batchnorm transformer-lm gan-two-models amp-gradscaler grad-accumulation sharded-eval \
    > "$out/overhead-cuda-2shared.txt" 2>&1
tail -n 14 "$out"/overhead-cuda-*.txt "$out/gpu-proof.log"
