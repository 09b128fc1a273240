#!/usr/bin/env bash
# GPU machine with one GPU: the series' whole single-GPU evidence at its head,
# one device call per STEP, as `nox -s evidence -- --plan` prints the calls
# (which parts of .dev/gpu each carries; each call within 30 s of the last).
#   bash gpu/evidence.sh stage PART...  # gpu/stage1.sh .dev/gpu/PART for each (part1 first)
#   bash gpu/evidence.sh bench [PART...] # carrying part2 and MANIFEST.sha256 (and PARTs):
#                                        # assemble, build _sm7x_C, the benchmarks alone on the GPU
#                                        # (NO_BENCH=1: none, e.g. to run the ALONE files again;
#                                        # BENCH_ONLY="OUT.json ...": those alone, after the build;
#                                        # NO_ALONE=1: not the ALONE files)
#   bash gpu/evidence.sh tests          # waits for the batch, returns its files
#                                        # (TESTS_ONLY="GLOB ...": those test files only;
#                                        # NO_ENGINES=1: no smoke or serve run)
#   bash gpu/evidence.sh engine         # after tests: the engine's time to first token
# The batch (the test files, and smoke then serve, side by side; nothing
# timed) starts at the end of `bench` in a process session of its own
# (setsid), so that it runs on through the time between the calls; `tests`
# starts it where `bench` did not, waits for it within its call and returns
# what it wrote (a `tests` call again waits for the rest).
# Each step is bounded by LIMIT seconds (540 by default; a part gets what is
# left of it), records its parts' times in /tmp/evidence/timeline.jsonl (kept
# between calls, with the machine's start) and returns two files from $OUT:
# evidence-STEP.log and evidence-STEP.tgz (the results files the writers made,
# logs, the timeline). Here: nox -s evidence -- --collect FOLDER... writes results/.
set -euo pipefail

# --- Names other work may change: each in this one place ------------------------
# The series' test files (globs in the assembled tree). ALONE_GLOBS: files that
# boot vLLM engines sizing their KV cache from the GPU's free memory, which
# fails ("Error in memory profiling") when another process frees GPU memory
# meanwhile: they run alone, in the bench call. The rest, side by side (JOBS at
# a time), beside the smoke and serve runs: every test file of the series (the
# pack's SERIES_TESTS, from the manifest), those of TEST_GLOBS first (the
# longest); TESTS_ONLY, where set, runs its globs alone (a re-run of some).
ALONE_GLOBS="tests/v1/attention/test_triton_turing_attn.py"
TEST_GLOBS="tests/distributed/test_host_reduce.py tests/kernels/quantization/test_nvfp4_marlin_prefill_dequant.py
  tests/kernels/quantization/test_nvfp4_marlin_dequant.py
  tests/kernels/attention/test_paged_prefill_attention_sm75.py"
JOBS=${JOBS:-4}
# The smoke and serve runs' attention backend (TRITON_TURING_ATTN serves only
# on SM75: on an H200 the engines run TRITON_ATTN, and the backend's own GPU
# tests cover the Turing route with SM75 reported), their share of the GPU's
# memory at startup, and a KV cache of a fixed size (no memory profiling, so
# that the tests beside them cannot upset it). The series' settings of the
# serve run (a Turing pair's, less what needs two ranks or an SM75 GPU) are
# gpu/serve.py's ENGINE.
ATTENTION_BACKEND=TRITON_ATTN
GPU_SHARE=0.25
KV_CACHE_BYTES=4294967296
# The benchmarks, alone on the GPU, each with its time cap (seconds); the
# first needs no _sm7x_C and runs while the module compiles on the CPU.
BENCHES=(
  "150 nvfp4_dequant.json python3 bench/nvfp4_dequant.py"
  "150 bench_prefill_attention.json python3 bench/prefill_attention.py"
  "210 bench_prefill_crossover.json python3 bench/prefill_crossover.py --reps 40 --head-dims 256 128 64"
)
# Through the engine, alone on the GPU, in a call of its own after `tests`
# (the `engine` step, on the tree `bench` assembled and built; `nox -s
# evidence -- --plan` offers the call).
EXTRA_BENCHES=(
  "480 prefill_ttft.json python3 bench/prefill_ttft.py"
)
# ----------------------------------------------------------------------------------

STEPS="stage bench tests batch engine"
step=${1:-}
shift || true
case " $STEPS " in
  *" $step "*) ;;
  *) echo "error: bash gpu/evidence.sh STEP [PART...], STEP one of: $STEPS"; exit 2 ;;
esac
# vLLM engine arguments (JSON) over gpu/smoke.py's and gpu/serve.py's own.
ENGINE="{\"attention_backend\": \"$ATTENTION_BACKEND\", \"gpu_memory_utilization\": $GPU_SHARE,
  \"kv_cache_memory_bytes\": $KV_CACHE_BYTES}"
root=${RUN_ROOT:-/tmp/vllm-run}  # gpu/stage2.sh's
ev=${EVIDENCE:-/tmp/evidence}  # kept between the calls of one machine
keep=${KEEP:-/tmp/keep}        # gpu/stage1.sh's
W=$ev/$step
if [ "$step" = batch ]; then
  LIMIT=${BATCH_LIMIT:-600}
  OUT=$W
else
  : "${OUT:?error: OUT, the output folder of the device call, is not set}"
  LIMIT=${LIMIT:-540}
fi
rm -rf "$W"
mkdir -p "$W" "$OUT"
exec > >(tee -a "$OUT/evidence-$step.log") 2>&1
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
start=$(date +%s.%N)
echo "evidence $step: $(date -u +%FT%TZ), limit ${LIMIT} s, $*"

# When this machine (its first process) started, seconds since the epoch.
machine_start() {
  python3 -c "import os
btime = next(int(l.split()[1]) for l in open('/proc/stat') if l.startswith('btime'))
ticks = int(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])
print(btime + ticks / os.sysconf('SC_CLK_TCK'))"
}

# On every exit: the step in the timeline, its files in one archive.
finish() {
  local rc=$?
  printf '{"step": "%s", "args": "%s", "start": %s, "end": %s, "rc": %d, "machine_start": %s, "parts": [%s]}\n' \
    "$step" "$*" "$start" "$(date +%s.%N)" "$rc" "$(machine_start || echo null)" \
    "$(paste -sd, "$W/parts.jsonl" 2>/dev/null)" >> "$ev/timeline.jsonl"
  cp "$ev/timeline.jsonl" "$W/"
  if [ "$step" = batch ]; then touch "$W/done"; return; fi
  local packed=("$step")
  if [ "$step" = tests ] && [ -d "$ev/batch" ]; then
    cp "$ev/timeline.jsonl" "$ev/batch/"
    packed+=(batch)
  fi
  tar czf "$OUT/evidence-$step.tgz" -C "$ev" "${packed[@]}"
  echo "evidence $step: exit $rc after ${SECONDS} s; in \$OUT: $(find "$OUT" -type f -printf '%P (%s B) ')"
}
trap 'finish "$@"' EXIT

# Seconds CAP, or what is left of LIMIT if less (at least 1).
budget() {
  local left=$((LIMIT - SECONDS))
  if ((left < $1)); then echo $((left > 1 ? left : 1)); else echo "$1"; fi
}

# CAP NAME COMMAND...: COMMAND under `timeout`, its time and status in parts.jsonl.
bounded() {
  local t rc=0 name=$2 t0
  t=$(budget "$1")
  shift 2
  t0=$(date +%s.%N)
  echo "evidence: ${t} s for $name: $*"
  timeout -k 15 "$t" "$@" || rc=$?
  printf '{"part": "%s", "start": %s, "end": %s, "rc": %d, "cap_s": %d}\n' \
    "$name" "$t0" "$(date +%s.%N)" "$rc" "$t" >> "$W/parts.jsonl"
  echo "evidence: $name exit $rc after ${SECONDS} s of the step"
  return 0
}

# BENCH...: each "CAP OUT COMMAND" in turn, bounded, its results file in $W/OUT.
run_benches() {
  local b cap out cmd
  for b in "$@"; do
    read -r cap out cmd <<<"$b"
    # shellcheck disable=SC2086 # cmd is a command line
    bounded "$cap" "${out%.json}" $cmd --out "$W/$out"
  done
}

stage_parts() {
  local p
  for p in "$@"; do [ "$p" = part1 ] && bounded 60 stage-part1 bash gpu/stage1.sh .dev/gpu/part1; done
  for p in "$@"; do [ "$p" != part1 ] && bounded 60 "stage-$p" bash gpu/stage1.sh ".dev/gpu/$p"; done
  return 0
}

# The batch, in a session of its own: it outlives the call that starts it.
start_batch() {
  need_tree
  if [ -d "$ev/batch" ] && [ ! -f "$ev/batch/done" ]; then
    echo "evidence: a batch is running already"
    return 0
  fi
  echo "evidence: the batch starts (gpu/evidence.sh batch, setsid)"
  # From a copy: the next call lays the working tree down again under a running bash.
  cp gpu/evidence.sh "$ev/evidence.sh"
  setsid bash "$ev/evidence.sh" batch </dev/null >/dev/null 2>&1 &
}

# files: the series' test files that GLOBS select in the assembled tree,
# less ALONE_GLOBS' where GLOBS are others; 1 where none.
test_files() {
  local g f alone=()
  files=()
  if [ "$1" != "$ALONE_GLOBS" ]; then
    for g in $ALONE_GLOBS; do for f in "$root"/src/$g; do alone+=("${f#"$root/src/"}"); done; done
  fi
  for g in $1; do
    for f in "$root"/src/$g; do
      f=${f#"$root/src/"}
      [ -f "$root/src/$f" ] && [[ " ${files[*]} ${alone[*]} " != *" $f "* ]] && files+=("$f")
    done
  done
  ((${#files[@]})) || { echo "error: no test file in $root/src matches $1"; return 1; }
}

need_tree() {
  [ -d "$root/src/vllm" ] || {
    echo "error: no $root/src/vllm: a fresh machine; start again with the plan's first call"
    exit 1
  }
  # gpu/site: sitecustomize.py, the stand-in for an import the image cannot serve.
  export PYTHONPATH=$root/src:$root/site:$PWD/gpu/site
}

case $step in
  stage)
    stage_parts "$@"
    ;;
  bench)
    stage_parts "$@"
    # The load as packed, kept for gpu/serve.sh in the next call (part2 need not travel again).
    (cd .dev/gpu && grep ' part2/' MANIFEST.sha256 | sha256sum -c --quiet) \
      || { echo "error: .dev/gpu/part2 differs from what was packed"; exit 1; }
    rm -rf "$keep/gpu" && mkdir -p "$keep/gpu" && cp -r .dev/gpu/part2 .dev/gpu/MANIFEST.sha256 "$keep/gpu/"
    BUILD=0 TESTS=none bounded 150 assemble bash gpu/stage2.sh
    need_tree
    if [ "${NO_BENCH:-0}" = 1 ]; then BENCHES=(); fi
    after=("${BENCHES[@]:1}")
    if [ -n "${BENCH_ONLY:-}" ]; then # a re-run of some: each after the build, which they may need
      after=()
      for b in "${BENCHES[@]}" "${EXTRA_BENCHES[@]}"; do
        read -r _ out _ <<<"$b"
        [[ " $BENCH_ONLY " != *" $out "* ]] || after+=("$b")
      done
      BENCHES=()
    fi
    beside=
    if ((${#BENCHES[@]})); then
      run_benches "${BENCHES[0]}" &
      beside=$!
    fi
    # BUILD: the series' module with compute_75 PTX, linked into the tree (one line).
    bounded 300 build python3 -m serieskit build --tree "$root/src" --out "$root/build" --arch 75 --ptx --link --report "$W/build_report.json"
    [ -z "$beside" ] || wait "$beside" # by its id: a bare wait also waits for the log's tee
    run_benches "${after[@]+"${after[@]}"}"
    if [ "${NO_ALONE:-0}" != 1 ] && test_files "$ALONE_GLOBS"; then
      # Its runs took 222 to 246 s, and once over 270: room to 360.
      t=$(budget 360)
      TEST_TIMEOUT=$((t > 60 ? t - 30 : t)) bounded "$t" tests-alone \
        python3 gpu/run_tests.py "$root/src" "$W/series_gpu_tests_alone.json" "${files[@]}"
    fi
    [ "${NO_BATCH:-0}" = 1 ] || start_batch
    ;;
  tests)
    [ -d "$ev/batch" ] || start_batch
    # Until the batch is done, leaving 20 s to pack what it wrote.
    while [ ! -f "$ev/batch/done" ] && ((SECONDS < LIMIT - 20)); do sleep 2; done
    [ -f "$ev/batch/done" ] || echo "evidence: the batch is still running: call tests again"
    ;;
  engine)
    need_tree
    [ ! -d "$ev/batch" ] || [ -f "$ev/batch/done" ] || {
      echo "error: the batch is still running: call tests again first"; exit 1; }
    run_benches "${EXTRA_BENCHES[@]}"
    ;;
  batch)
    need_tree
    test_files "${TESTS_ONLY:-$TEST_GLOBS $(cat "$root/src/SERIES_TESTS" 2>/dev/null)}" || exit 1
    t=$(budget 540)
    {
      TEST_TIMEOUT=$((t - 30)) JOBS=$JOBS bounded "$t" tests \
        python3 gpu/run_tests.py "$root/src" "$W/series_gpu_tests.json" "${files[@]}"
      # The patches' cases in upstream files (SERIES_TEST_CASES: a file and
      # pytest's -k expression per line), those alone of their files.
      cases=() expr=
      while read -r f e; do
        [ -n "$f" ] && cases+=("$f") && expr="${expr:+$expr or }$e"
      done < <([ -n "${TESTS_ONLY:-}" ] || cat "$root/src/SERIES_TEST_CASES" 2>/dev/null)
      if ((${#cases[@]})); then
        t=$(budget 120)
        TEST_TIMEOUT=$((t > 60 ? t - 30 : t)) bounded "$t" test-cases \
          python3 gpu/run_tests.py "$root/src" "$W/series_gpu_tests_cases.json" -k "$expr" "${cases[@]}"
      fi
    } &
    beside=$!
    [ "${NO_ENGINES:-0}" = 1 ] || {
      bounded 200 smoke python3 gpu/smoke.py "$W/series_gpu_smoke.json" --engine-args "$ENGINE"
      # serve.py ends a boot that hangs itself (--boot-limit), so that it still writes its file.
      PART2=$keep/gpu/part2 OUT=$W bounded 330 serve \
        bash gpu/serve.sh --engine-args "$ENGINE" --boot-limit 240
    } &
    wait "$beside" "$!"
    ;;
esac
