#!/bin/bash
# Time one of the README's commands as a user runs it, with the machine's load:
#   TIMING_NOTE="a fresh clone" ci/time-command.sh DIR python3 -m nox -s apply build test
# run in the checkout to measure; TIMING_NOTE says from what state (a fresh
# clone, or what ran there before). It samples the 1-minute load average every
# 5 s while the command runs and writes, in DIR: command, note, commit,
# started, wall_s, rc, output.log, load.txt, du.txt (bytes of .nox, .work and
# the toolkit's cache afterwards) and, for nox -s ci, its timings.json. Then,
# in this repository:
#   python3 -m serieskit figures --record-timing DIR
# writes them as a results file (kind "timing") for the README's timing block.
set -u
dir=$(realpath -m "$1"); shift
mkdir -p "$dir"
echo "$*" > "$dir/command"
echo "${TIMING_NOTE:?say from what state: TIMING_NOTE=\"a fresh clone\"}" > "$dir/note"
git rev-parse HEAD > "$dir/commit"
: > "$dir/load.txt"
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$dir/load.txt"; sleep 5; done ) &
sampler=$!
date -u +%FT%TZ > "$dir/started"
start=$(date +%s.%N)
"$@" > "$dir/output.log" 2>&1
echo $? > "$dir/rc"
end=$(date +%s.%N)
kill "$sampler"
echo "$end - $start" | bc > "$dir/wall_s"
# nox -s ci's own stage timings, when this run wrote them
if [ -n "$(find .work/ci/timings.json -newer "$dir/started" 2>/dev/null)" ]; then
  cp .work/ci/timings.json "$dir/"
fi
cache=${VLLM_SERIES_CACHE:-$HOME/.cache/vllm-series}
du -sb .nox .work "$cache" > "$dir/du.txt" 2>/dev/null
exit "$(cat "$dir/rc")"
