#!/usr/bin/env bash
# GPU machine, after gpu/stage1.sh (part1, part1-2, wheels) and gpu/stage2.sh
# (which assembles the release and the series' overlay under /tmp/vllm-run):
# build the series' wheel here with the toolkit from what the recipe carried,
# pip install it into a fresh target, check what `vllm serve` imports from it
# (gpu/check_pack_imports.py probe), serve the small local checkpoint with
# `vllm serve` and ask it through the openai package (gpu/serve.py). Results
# go to $OUT: serve_h200.json (results schema), serve_imports.json,
# serve.log (the server), wheel.log.
#   TESTS=none BUILD=0 bash gpu/stage2.sh bash gpu/serve.sh
# or, in a call of its own after stage 2's (within 30 s): bash gpu/serve.sh
# (arguments go to gpu/serve.py, e.g. --engine-args JSON)
set -euo pipefail
root=/tmp/vllm-run
# stage 2's environment, where stage 2 ran in an earlier call
export PYTHONPATH=${PYTHONPATH:-$root/src:$root/site} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
part2=${PART2:-.dev/gpu/part2}
[ -d "$root/src/vllm" ] || { echo "error: run gpu/stage2.sh first (no $root/src)"; exit 1; }
[ -f "$part2/release.tar.xz" ] || {
  echo "error: $part2 has no release.tar.xz: pack the load again (nox -s overlay -- --gpu)"; exit 1; }
# The load as packed: every file of part2 against the packer's sha256 list
# (carry .dev/gpu/MANIFEST.sha256 with part2).
manifest=$(dirname "$part2")/MANIFEST.sha256
[ -f "$manifest" ] || { echo "error: $manifest is missing: carry it with $part2"; exit 1; }
(cd "$(dirname "$part2")" && grep " $(basename "$part2")/" MANIFEST.sha256 | sha256sum -c --quiet) \
  || { echo "error: $part2 differs from what was packed (see above)"; exit 1; }
# The wheels stage 1 kept (/tmp/keep/whl): those of this load, every one.
keep=${KEEP:-/tmp/keep}
grep -E " wheels(-[0-9]+)?/whl/" "$manifest" | sed -E 's# wheels(-[0-9]+)?/whl/# whl/#' > "$keep/whl.sha256"
(cd "$keep" && sha256sum -c --quiet whl.sha256) \
  || { echo "error: $keep/whl is not this load's wheels: run gpu/stage1.sh .dev/gpu/wheels again"; exit 1; }
rm -rf "$root/release" && mkdir -p "$root/release" "$OUT"
tar xJf "$part2/release.tar.xz" -C "$root/release"
python3 gpu/serve.py "$OUT/serve_h200.json" --root "$root" "$@"
