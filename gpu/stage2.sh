#!/usr/bin/env bash
# GPU machine, the run after gpu/stage1.sh's (within 30 s of the last):
# assemble the packed vLLM release (part2/VERSION, written from pin.toml)
# with the series' overlay under /tmp/vllm-run (gpu/assemble.sh; the core
# module and the wheels come from /tmp/keep), build the series' native
# module with compute_75 PTX (BUILD=0 skips it), run the series' test files
# (those in $TESTS, space-separated, when set; none for none; SELECT is
# pytest's -k; COVERAGE=1 runs them under coverage.py), then whatever "$@"
# names (e.g. the A/B harness). Results go to $OUT.
set -euo pipefail
part2=${PART2:-.dev/gpu/part2}
root=/tmp/vllm-run
bash gpu/assemble.sh "$root" "$part2" /tmp/keep
# gpu/site: the overlay loads its module of the series' ops (sitecustomize.py).
export PYTHONPATH=$root/src:$root/site:$PWD/gpu/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if [ "${BUILD:-1}" != 0 ] && [ -d "$root/src/csrc/sm7x" ]; then
  python3 -m serieskit build --tree "$root/src" --out "$root/build" --arch 75 --ptx --link \
    --report "$OUT/build_report.json"
  # One archive: the GPU machine returns at most eight files from $OUT.
  mkdir -p "$root/sass"
  for f in "$root"/build/*.o; do cuobjdump -sass "$f" > "$root/sass/$(basename "$f" .o).sass.txt" 2>&1 || true; done
  tar czf "$OUT/sass.tgz" -C "$root/sass" .
fi
# shellcheck disable=SC2086 # TESTS is a list of paths
if [ "${TESTS:-}" != none ]; then
  python3 gpu/run_tests.py "$root/src" "$OUT/tests.json" ${SELECT:+-k "$SELECT"} ${TESTS:-} \
    || echo "TESTS FAILED"
fi
"$@"
