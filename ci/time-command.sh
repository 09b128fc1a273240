#!/bin/bash
# Time one of the README's commands as a user runs it, with the machine's load
# and the disk it takes:
#   TIMING_NOTE="a fresh clone" ci/time-command.sh DIR python3 -m nox -s apply build test
# run in the checkout to measure; TIMING_NOTE says from what state (a fresh
# clone, or what ran there before). For a clean machine's figures, point
# XDG_CACHE_HOME at an empty folder named .cache (pip's, pre-commit's, the
# toolkit's and virtualenv's caches all go there; the record names them
# ~/.cache/NAME).
#
# It samples the 1-minute load average every 5 s and the disk of every place
# the command writes every 10 s while the command runs, and writes, in DIR:
# command, note, commit, started, wall_s, rc, output.log, load.txt, disk.txt
# (a line per sample: the time, then "BYTES PLACE" per place, tab-separated),
# du.txt (bytes of each place afterwards) and, for nox -s ci, its
# timings.json. The places: .nox, .work and dist/ of the checkout; the
# toolkit's cache (VLLM_SERIES_CACHE), pip's (PIP_CACHE_DIR) and pre-commit's
# (PRE_COMMIT_HOME), each at its default under the cache home where unset;
# every other folder of the cache home that the command made; and its
# temporary files: the command runs with TMPDIR=DIR/tmp, an empty folder, and
# what it leaves there is counted as TMPDIR (then removed: this script's own).
# Then, in this repository:
#   python3 -m serieskit figures --record-timing DIR
# writes them as a results file (kind "timing") for the README's timing block.
set -u
dir=$(realpath -m "$1"); shift
mkdir -p "$dir"
echo "$*" > "$dir/command"
echo "${TIMING_NOTE:?say from what state: TIMING_NOTE=\"a fresh clone\"}" > "$dir/note"
git rev-parse HEAD > "$dir/commit"
home=${XDG_CACHE_HOME:-$HOME/.cache}
toolkit=${VLLM_SERIES_CACHE:-$home/vllm-series}
pipcache=${PIP_CACHE_DIR:-$home/pip}
precommit=${PRE_COMMIT_HOME:-$home/pre-commit}
tmp="$dir/tmp"
rm -rf "$tmp" && mkdir -p "$tmp"
before=$(ls -A "$home" 2>/dev/null)

places() {  # label<TAB>path, one a line: every place counted
  printf '%s\t%s\n' .nox .nox .work .work dist dist "$toolkit" "$toolkit" \
    "$pipcache" "$pipcache" "$precommit" "$precommit"
  local name
  for name in $(ls -A "$home" 2>/dev/null); do
    case "$home/$name" in "$toolkit" | "$pipcache" | "$precommit") continue ;; esac
    grep -qxF "$name" <<< "$before" || printf '%s\t%s\n' "$home/$name" "$home/$name"
  done
  printf '%s\t%s\n' TMPDIR "$tmp"
}

sizes() {  # size<TAB>label per place, 0 for one not there
  local label path size
  while IFS=$'\t' read -r label path; do
    # du fails on a file removed while it counts, and still prints the total
    size=$(du -sb "$path" 2>/dev/null | cut -f1)
    printf '%s\t%s\n' "${size:-0}" "$label"
  done < <(places)
}

: > "$dir/load.txt"
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$dir/load.txt"; sleep 5; done ) &
sampler=$!
: > "$dir/disk.txt"
( while :; do
    line=$(date -u +%FT%TZ)
    while IFS=$'\t' read -r size label; do line+=$'\t'"$size $label"; done < <(sizes)
    echo "$line" >> "$dir/disk.txt"
    sleep 10
  done ) &
disk_sampler=$!
date -u +%FT%TZ > "$dir/started"
start=$(date +%s.%N)
TMPDIR="$tmp" "$@" > "$dir/output.log" 2>&1
echo $? > "$dir/rc"
end=$(date +%s.%N)
kill "$sampler" "$disk_sampler"
echo "$end - $start" | bc > "$dir/wall_s"
# nox -s ci's own stage timings, when this run wrote them
if [ -n "$(find .work/ci/timings.json -newer "$dir/started" 2>/dev/null)" ]; then
  cp .work/ci/timings.json "$dir/"
fi
sizes > "$dir/du.txt"
rm -rf "$tmp"
exit "$(cat "$dir/rc")"
