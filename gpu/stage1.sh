#!/usr/bin/env bash
# GPU machine, the runs before gpu/stage2.sh: keep in /tmp/keep what one run
# cannot carry beside part2 (made here by `nox -s overlay -- --gpu`): the
# released wheel's compiled core module (part1, in pieces where larger than a
# run takes: part1, part1-2, ...) and the wheels the image lacks (wheels, and
# wheels-2, ... where they need more than one run). One run each, part1
# first (it clears what an earlier release left), each within 30 s of the
# last (the machine is kept that long).
# KEEP moves /tmp/keep (gpu/check_pack_imports.py does, here).
#   bash gpu/stage1.sh .dev/gpu/part1
set -euo pipefail
part=${1:-.dev/gpu/part1}
keep=${KEEP:-/tmp/keep}
mkdir -p "$keep"
if [ "$(basename "$part")" = part1 ]; then rm -rf "${keep:?}"/*; fi
if [ -d "$part/whl" ]; then
  mkdir -p "$keep/whl"
  cp "$part"/whl/*.whl "$keep/whl/"
  echo "stage1: $(find "$keep/whl" -name '*.whl' | wc -l) wheels in $keep/whl"
else
  cp "$part"/*.xz* "$keep/"
fi
ls -la "$keep"
