#!/usr/bin/env bash
# GPU machine, no staging needed: Nsight Compute on one launch of the Turing
# prefill attention's key loop per shape (bench/prefill_attention_profile.py,
# which imports no vLLM), 2048 query tokens after CONTEXT (32768 by default),
# no split-KV. TREE is a folder that bench/prefill_attention_variants.py
# --prepare made here and the call carries (.dev/gpu/kernel by default);
# the shapes are names from that script's list (default: the shipped shape of
# each head dim). Writes $OUT/ncu_<shape>.txt: where the warps stall
# (WarpStateStats with its stall reasons, SourceCounters), what the pipes and
# shared memory did, and the occupancy; and $OUT/sass_<shape>.csv, the
# stall samples per SASS instruction (summarize it here with
# bench/prefill_attention_profile.py --stalls). Clocks left alone (METHOD.md).
#   export OUT; bash gpu/profile_attention.sh [SHAPE ...]
set -euo pipefail
: "${OUT:?error: OUT, the output folder of the device call, is not set}"
tree=${TREE:-.dev/gpu/kernel}
[ -f "$tree/csrc/sm7x/paged_prefill_attention_sm75.cu" ] || {
  echo "error: no kernel in $tree: run bench/prefill_attention_variants.py --prepare $tree here and carry it"
  exit 1
}
command -v ncu > /dev/null || { echo "error: ncu (Nsight Compute) is not on PATH"; exit 1; }
mkdir -p "$OUT"
lib=/tmp/libsm75_prefill_variants.so
python3 bench/prefill_attention_variants.py --tree "$tree" --build "$lib"
sections=(SpeedOfLight WarpStateStats SchedulerStats ComputeWorkloadAnalysis
  MemoryWorkloadAnalysis Occupancy InstructionStats SourceCounters LaunchStats)
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(hd64.w4m2k64c2.lz.a1.rs hd128.w12m1k32c1.rs hd256.w8m1k16c1.kv.rs)
for s in "${shapes[@]}"; do
  echo "profile: $s"
  report=/tmp/ncu_$s
  if timeout "${LIMIT:-150}" ncu --clock-control none --target-processes application-only \
    -k regex:paged_prefill_attention_sm75_kernel --launch-skip 1 -c 1 \
    "${sections[@]/#/--section=}" -f -o "$report" \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    python3 bench/prefill_attention_profile.py --lib "$lib" --variant "$s" \
    --context "${CONTEXT:-32768}" > "$OUT/ncu_$s.log" 2>&1; then
    ncu -i "$report.ncu-rep" --page details --print-details all > "$OUT/ncu_$s.txt" 2>&1
    ncu -i "$report.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$s.csv" 2>&1 \
      || echo "profile: $s: no source page (see $OUT/sass_$s.csv)"
    rm "$OUT/ncu_$s.log"
  else
    echo "profile: $s exited $? (see $OUT/ncu_$s.log)"
  fi
done
