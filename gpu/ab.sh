#!/usr/bin/env bash
# GPU machine, after stage2.sh: the A/B/A/B harness on the assembled vLLM.
#   bash gpu/ab.sh --arms e2e/arms/reference.json e2e/arms/copy_engine.json \
#       --out "$OUT/e2e.json" --model small --ceiling
set -euo pipefail
root=/tmp/vllm-run
[ -d "$root/src/vllm" ] || { echo "error: run gpu/stage2.sh first (no $root)"; exit 1; }
# gpu/site: the overlay loads its module of the series' ops (sitecustomize.py).
export PYTHONPATH=$root/src:$root/site:$PWD/gpu/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
python3 e2e/ab.py "$@"
