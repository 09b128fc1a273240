#!/usr/bin/env bash
# GPU machine, after gpu/stage2.sh built _sm7x_C (within the time the machine
# is kept): Nsight Compute on one launch of the Turing prefill attention's
# key loop per head dim (bench/prefill_attention_profile.py, which imports no
# vLLM), 2048 query tokens after CONTEXT (32768 by default), no split-KV.
# Writes $OUT/ncu_hd64.txt, ncu_hd128.txt, ncu_hd256.txt: the sections that
# say where the warps stall (WarpStateStats, SourceCounters), what the pipes
# and shared memory did, and the occupancy. Clocks left alone (METHOD.md).
#   export OUT; bash gpu/profile_attention.sh [HEAD_DIM ...]
set -euo pipefail
: "${OUT:?error: OUT, the output folder of the device call, is not set}"
lib=${LIB:-/tmp/vllm-run/src/vllm/_sm7x_C.abi3.so}
[ -f "$lib" ] || { echo "error: no $lib: run gpu/stage2.sh (BUILD=1) first"; exit 1; }
command -v ncu > /dev/null || { echo "error: ncu (Nsight Compute) is not on PATH"; exit 1; }
mkdir -p "$OUT"
sections=(SpeedOfLight WarpStateStats SchedulerStats ComputeWorkloadAnalysis
  MemoryWorkloadAnalysis Occupancy InstructionStats SourceCounters LaunchStats)
dims=("$@")
[ ${#dims[@]} -gt 0 ] || dims=(64 128 256)
for d in "${dims[@]}"; do
  echo "profile: head dim $d"
  timeout "${LIMIT:-150}" ncu --clock-control none --target-processes application-only \
    -k regex:paged_prefill_attention_sm75_kernel --launch-skip 1 -c 1 \
    "${sections[@]/#/--section=}" \
    python3 bench/prefill_attention_profile.py --lib "$lib" --head-dim "$d" \
    --context "${CONTEXT:-32768}" > "$OUT/ncu_hd$d.txt" 2>&1 \
    || echo "profile: head dim $d exited $? (see $OUT/ncu_hd$d.txt)"
done
