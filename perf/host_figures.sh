#!/usr/bin/env bash
# The float32 Sum AllReduce at 8 B (time), 1 MiB and 64 MiB (bus bandwidth) for 2 and
# 4 ranks (processes started by loomrun) over shm and over sockets, from
# all_reduce_perf, as one table. Usage: perf/host_figures.sh [build-dir]
set -euo pipefail
build=${1:-build}
run=("$build/tools/loomrun" --timeout 600)
bench="$build/perf/all_reduce_perf"
printf '%-8s %-6s %18s %16s %16s\n' transport ranks "8 B time (us)" "1 MiB busbw" "64 MiB busbw"
echo "# out-of-place / in-place; busbw in GB/s"
for transport in shm socket; do
  for n in 2 4; do
    env=()
    [ "$transport" = socket ] && env=(NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo)
    out=$(env "${env[@]}" "${run[@]}" -n "$n" "$bench" -b 8 -e 64M -f 2 -w 5 -n 20 -d float -o sum)
    row=()
    row+=("$(awk '$1 == 8 { printf "%s / %s", $6, $10 }' <<<"$out")")
    for size in 1048576 67108864; do
      row+=("$(awk -v s="$size" '$1 == s { printf "%s / %s", $8, $12 }' <<<"$out")")
    done
    printf '%-8s %-6s %18s %16s %16s\n' "$transport" "$n" "${row[@]}"
  done
done
