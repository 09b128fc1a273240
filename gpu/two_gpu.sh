#!/usr/bin/env bash
# GPU machine with two GPUs (nvidia-h200-x2): the two-GPU evidence of the
# series (the host all-reduce against NCCL, the TP=2 tests, the end-to-end
# A/B), one device call per STEP, each under the call's 10 minutes and its
# eight files from $OUT. Every step runs with NCCL_P2P_DISABLE=1; vLLM boots
# run with the custom all-reduce off (the harness and the TP=2 tests set
# disable_custom_all_reduce). docs/gpu-machine.md#two-gpus-call-by-call
# gives the order and the expected durations:
#   bash gpu/stage1.sh .dev/gpu/part1      # and part1-2, wheels: one call each
#   export OUT; bash gpu/two_gpu.sh build  # carrying .dev/gpu/part2 and .dev/gpu/MANIFEST.sha256
#   export OUT; bash gpu/two_gpu.sh STEP   # host-reduce nvfp4 overlap compiled e2e1 e2e2
# LIMIT (seconds, 570 by default) bounds the whole step; each part gets at
# most what is left of it (`timeout`), and a test file cut short is still
# written to its JSON (TEST_TIMEOUT, gpu/run_tests.py).
set -euo pipefail
STEPS="build host-reduce nvfp4 overlap compiled e2e1 e2e2"
step=${1:-}
case " $STEPS " in
  *" $step "*) ;;
  *) echo "error: bash gpu/two_gpu.sh STEP, STEP one of: $STEPS"; exit 2 ;;
esac
: "${OUT:?error: OUT, the output folder of the device call, is not set}"
root=/tmp/vllm-run
LIMIT=${LIMIT:-570}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/two_gpu-$step.log") 2>&1
export NCCL_P2P_DISABLE=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
echo "two_gpu $step: $(date -u +%FT%TZ), limit ${LIMIT} s"

# Seconds CAP, or what is left of LIMIT if less (at least 1).
budget() {
  local left=$((LIMIT - SECONDS))
  if ((left < $1)); then echo $((left > 1 ? left : 1)); else echo "$1"; fi
}

# CAP COMMAND...: COMMAND under `timeout`, its status reported, not fatal.
bounded() {
  local t rc=0
  t=$(budget "$1")
  shift
  echo "two_gpu: ${t} s for: $*"
  timeout -k 15 "$t" "$@" || rc=$?
  echo "two_gpu: exit $rc after ${SECONDS} s of the step: $*"
  free_gpus
  return 0
}

# Processes left on the GPUs by a part cut short (vLLM's workers outlive a
# killed parent), by id, so that the next part of the step has the GPUs.
free_gpus() {
  local pid
  for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
    kill -9 "$pid" 2>/dev/null && echo "two_gpu: ended $pid, left on a GPU"
  done
  return 0
}

need_tree() {
  [ -d "$root/src/vllm" ] || {
    echo "error: no $root/src/vllm: the machine is a fresh one; run gpu/stage1.sh" \
      "(.dev/gpu/part1, part1-2, wheels) and bash gpu/two_gpu.sh build first"
    exit 1
  }
  # gpu/site: the overlay loads its module of the series' ops (sitecustomize.py).
  export PYTHONPATH=$root/src:$root/site:$PWD/gpu/site
}

# NAME CAP SELECT FILE...: the series' test files into $OUT/NAME.json and
# $OUT/NAME-logs.tgz; pytest stops 30 s before the part's time is up.
tests() {
  local name=$1 cap=$2 select=$3 t
  shift 3
  t=$(budget "$cap")
  export TEST_TIMEOUT=$((t > 60 ? t - 30 : t))
  bounded "$t" python3 gpu/run_tests.py "$root/src" "$OUT/$name.json" ${select:+-k "$select"} "$@"
}

overlap=tests/distributed/test_dbo_tensor_parallel.py
arms=(e2e/arms/reference.json e2e/arms/copy_engine.json e2e/arms/overlap.json
  e2e/arms/overlap_copy_engine.json)
case $step in
  build)
    # Assemble the release with the overlay, build the csrc/sm7x module with compute_75
    # PTX: $OUT/build_report.json, $OUT/sass.tgz.
    export TESTS=none
    bounded 560 bash gpu/stage2.sh
    ;;
  host-reduce)
    # Item 1: both modes bit-identical to NCCL, CUDA graphs, the timeouts;
    # time per call and bandwidth against NCCL and the pinned-copy floor,
    # the copy-engine mode's host time. The benchmark first (about a
    # minute), the tests in what is left.
    need_tree
    bounded 120 python3 bench/host_reduce.py --out "$OUT/bench_host_reduce_h200x2.json"
    tests host_reduce 560 "" tests/distributed/test_host_reduce.py \
      tests/config/test_host_reduce_config.py
    ;;
  nvfp4)
    # Item 2: the NVFP4 GPU tests (one GPU each; the series has no TP=2
    # NVFP4 test since the route became a mode of the Marlin kernel).
    need_tree
    tests nvfp4 560 "" tests/kernels/quantization/test_nvfp4_marlin_prefill_dequant.py \
      tests/kernels/quantization/test_nvfp4_marlin_dequant.py
    ;;
  overlap)
    # Item 2: the overlap's GPU tests but the compiled one: the micro-batches
    # on one GPU, greedy at TP=2 with and without DBO, eager.
    need_tree
    tests overlap 560 "not compiled" "$overlap"
    ;;
  compiled)
    # Item 2: greedy at TP=2 under torch.compile, decode in CUDA graphs.
    need_tree
    tests overlap_compiled 560 "compiled" "$overlap"
    ;;
  e2e1)
    # Item 3, round 1: the checkpoint written, a warm boot, the arms in order.
    need_tree
    bounded 560 bash gpu/ab.sh --model seed --rounds 1 --arms "${arms[@]}" \
      --out "$OUT/e2e1.json"
    ;;
  e2e2)
    # Item 3, round 2: the arms in reverse order, then the P2P-on ceiling
    # (a boot that hangs is ended after 240 s).
    need_tree
    bounded 560 bash gpu/ab.sh --model seed --rounds 1 --ceiling --timeout 240 \
      --arms "${arms[3]}" "${arms[2]}" "${arms[1]}" "${arms[0]}" --out "$OUT/e2e2.json"
    ;;
esac
echo "two_gpu $step: done after ${SECONDS} s; in \$OUT:" \
  "$(find "$OUT" -type f -printf '%P (%s B) ' | head -c 2000)"
