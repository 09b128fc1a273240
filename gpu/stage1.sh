#!/usr/bin/env bash
# GPU machine, run 1 of 2: keep the compiled core module of the vLLM wheel
# (part1, made here by `nox -s overlay -- --gpu`) in /tmp for run 2. A module
# larger than one run takes comes in pieces (part1, part1-2, ...): one run
# each, part1 first (it clears what an earlier release left).
set -euo pipefail
part1=${1:-.dev/gpu/part1}
mkdir -p /tmp/keep
if [ "$(basename "$part1")" = part1 ]; then rm -f /tmp/keep/*; fi
cp "$part1"/*.xz* /tmp/keep/
ls -la /tmp/keep
