#!/usr/bin/env bash
# GPU machine, run 1 of 2: keep the compiled core module of the vLLM wheel
# (part1, made here by `nox -s overlay -- --gpu`) in /tmp for run 2.
set -euo pipefail
part1=${1:-.dev/gpu/part1}
mkdir -p /tmp/keep
cp "$part1"/*.xz /tmp/keep/
ls -la /tmp/keep
