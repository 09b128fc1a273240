#!/usr/bin/env bash
# GPU machine, after stage2.sh: the A/B/A/B harness on the assembled vLLM.
#   bash ci/gpu/ab.sh --arms ci/e2e/arms/reference.json ci/e2e/arms/copy_engine.json \
#       --out "$OUT/e2e.json" --model small --ceiling
set -euo pipefail
root=/tmp/vllm-run
[ -d "$root/src/vllm" ] || { echo "error: run ci/gpu/stage2.sh first (no $root)"; exit 1; }
export PYTHONPATH=$root/src:$root/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
python3 ci/e2e/ab.py "$@"
