#!/usr/bin/env bash
# What LOOM_CHECK_CALLS costs: the 8 B float32 Sum AllReduce time of 2 ranks
# (processes, shm) with the check off and on, alternating runs so that both
# see the same machine, and the median of each. Usage:
#   perf/call_check_cost.sh [build-dir] [pairs]
set -euo pipefail
build=${1:-build}
pairs=${2:-15}
run=("$build/tools/loomrun" --timeout 600 -n 2 "$build/perf/all_reduce_perf" -b 8 -e 8 -w 2000 -n 20000 -c 0)
off=() on=()
for ((i = 0; i < pairs; i++)); do
  off+=("$(LOOM_CHECK_CALLS=0 "${run[@]}" | awk '$1 == 8 { print $6 }')")
  on+=("$(LOOM_CHECK_CALLS=1 "${run[@]}" | awk '$1 == 8 { print $6 }')")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
moff=$(median "${off[@]}")
mon=$(median "${on[@]}")
echo "8 B AllReduce, 2 ranks, shm, out-of-place time, median of $pairs runs of 20000 calls each"
echo "LOOM_CHECK_CALLS=0: ${moff} us   (runs: ${off[*]})"
echo "LOOM_CHECK_CALLS=1: ${mon} us   (runs: ${on[*]})"
awk -v a="$moff" -v b="$mon" 'BEGIN { printf "check on / off: %.2fx\n", b / a }'
