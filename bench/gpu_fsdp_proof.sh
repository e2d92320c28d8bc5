#!/usr/bin/env bash
# FSDP on a CUDA GPU (issue 11): every fixture converted with `--to fsdp`, run under torchrun with
# NCCL (1 rank), and `ddpify verify --to fsdp --device cuda` with 1 rank (NCCL) and 2 ranks sharing
# the GPU (gloo on CUDA tensors). Prints a Markdown table. Never part of CI.
#
#   bash bench/gpu_fsdp_proof.sh [--jobs N] [FIXTURE.py ...]     (needs ddpify installed for $PYTHON)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
jobs=8
if [ "${1:-}" = "--jobs" ]; then jobs=$2; shift 2; fi
fixtures=("$@")
[ ${#fixtures[@]} -eq 0 ] && fixtures=("$root"/fixtures/*.py "$root"/fixtures/fsdp/*.py)
work=$(mktemp -d)

prove_one() {  # one table row for one fixture
    local script name dir verdict1 verdict2 run
    script=$(realpath "$1")
    name=$(basename "$script" .py)
    dir="$work/$name" && mkdir -p "$dir" && cd "$dir" || return
    if ! timeout 120 "$py" -m ddpify convert "$script" --to fsdp -q -o "$dir/${name}_fsdp.py" >convert.log 2>&1; then
        echo "| $name | convert failed: $(tail -1 convert.log) | | |"; return
    fi
    if timeout -k 5 120 setsid "$py" -m torch.distributed.run --standalone --nproc_per_node=1 "${name}_fsdp.py" >run.log 2>&1; then
        run="ok"
    else
        run="FAIL: $(grep -m1 -E 'Error|error' run.log | cut -c1-120)"
    fi
    mkdir -p "$dir/verify"  # a clean directory: verify mirrors it, and the run above left checkpoints
    verdict1=$(cd "$dir/verify" && timeout -k 5 180 "$py" -m ddpify verify "$script" --to fsdp --device cuda --nproc 1 --timeout 90 2>&1 | tail -1 | cut -c1-110)
    verdict2=$(cd "$dir/verify" && timeout -k 5 180 "$py" -m ddpify verify "$script" --to fsdp --device cuda --nproc 2 --timeout 90 2>&1 | tail -1 | cut -c1-110)
    echo "| $name | $run | $verdict1 | $verdict2 |"
}
export -f prove_one
export py work

echo "FSDP on $(cd / && "$py" -c 'import torch; print(torch.cuda.get_device_name(0), "| torch", torch.__version__)'), $(date -u +%F)"
echo
echo "| fixture | torchrun, NCCL, 1 rank | verify --device cuda, 1 rank (NCCL) | verify --device cuda, 2 ranks on one GPU (gloo) |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${fixtures[@]}" | xargs -P "$jobs" -I{} bash -c 'prove_one "$@"' _ {} | sort
