#!/usr/bin/env bash
# Assemble the packed vLLM release with the series' overlay under ROOT, as
# gpu/stage2.sh does on the GPU machine (and gpu/check_pack_imports.py here,
# with its own python3 first on PATH): the wheels the image lacks (KEEP/whl,
# left by gpu/stage1.sh .dev/gpu/wheels) into ROOT/site with the released
# wheel's dist-info METADATA, the overlay into ROOT/src, the core module
# (KEEP, from part1's pieces) and FlashAttention's package beside it.
#   bash gpu/assemble.sh ROOT PART2 KEEP
set -euo pipefail
root=$1 part2=$2 keep=$3
version=$(cat "$part2/VERSION")
compgen -G "$keep/whl/*.whl" >/dev/null || {
  echo "error: no wheels in $keep/whl: run gpu/stage1.sh .dev/gpu/wheels (carrying it) first"; exit 1; }
compgen -G "$keep/_C_stable_libtorch.abi3.so.xz*" >/dev/null || {
  echo "error: no core module in $keep: run gpu/stage1.sh .dev/gpu/part1 (and part1-2) first"; exit 1; }
rm -rf "$root"; mkdir -p "$root/src" "$root/site"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$root/site" "$keep"/whl/*.whl
# vLLM reads its own version from its package metadata; the requirements in
# it let gpu/check_pack_imports.py probe check what this environment holds.
tar xJf "$part2/release.tar.xz" -C "$root/site" "vllm-$version.dist-info/METADATA"
tar xzf "$part2/overlay.tgz" -C "$root/src"
cat "$keep"/_C_stable_libtorch.abi3.so.xz* | xz -dc > "$root/src/vllm/_C_stable_libtorch.abi3.so"
xz -dc "$part2/fa.tar.xz" | tar xf - -C "$root/src"
