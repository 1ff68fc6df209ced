#!/usr/bin/env bash
# The socket plugin's figure on this host: Loom over sockets on loopback
# (2 processes, NCCL_SHM_DISABLE=1, AllReduce float32 64 MiB bus
# bandwidth) against what one TCP stream does on loopback (iperf3) and
# against Open MPI's MPI_Allreduce over `--mca btl tcp,self`, interleaved
# round after round in one run (figures on a VM drift between runs minutes
# apart), with the medians and the two ratios. Also Loom's 8 B AllReduce
# latency over sockets. Targets: Loom >= 0.7 x iperf3, >= 2 x Open MPI.
#
#   perf/socket_figure.sh [--rounds 5] [--build build-sock-rel] [--no-build]
#       [--size 64M] [--iters 20] [--env "NCCL_SOCKET_NTHREADS=2 ..."]
#
# Builds Loom (Release, no CUDA) in --build unless --no-build, and
# perf/baselines/mpi_coll.c with mpicc. Needs iperf3 (Debian package
# iperf3) and Open MPI (openmpi-bin libopenmpi-dev); a missing one is
# skipped with its package named. Exit status 0 whatever the figures:
# they are for reading, the tests check behaviour.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

rounds=5 build=build-sock-rel do_build=1 size=64M iters=20 extra=""
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift ;;
    --build) build=$2; shift ;;
    --no-build) do_build=0 ;;
    --size) size=$2; shift ;;
    --iters) iters=$2; shift ;;
    --env) extra=$2; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "socket_figure.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 && $iters =~ ^[0-9]+$ && $iters -ge 1 ]] ||
  { echo "socket_figure.sh: --rounds and --iters take counts >= 1" >&2; exit 2; }
case $size in
  *[Kk]) bytes=$((${size%?} << 10)) ;; *[Mm]) bytes=$((${size%?} << 20)) ;; *[Gg]) bytes=$((${size%?} << 30)) ;;
  *) bytes=$size ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-sockfig.XXXXXX") || exit 1
iperf_pid=
cleanup() { [ -n "$iperf_pid" ] && kill "$iperf_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ $do_build -eq 1 ]; then
  echo "== building Loom (Release, no CUDA) in $build"
  { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_CUDA=OFF &&
    cmake --build "$build" -j"$(nproc)" --target loomrun all_reduce_perf; } >"$tmp/build.txt" 2>&1 ||
    { cat "$tmp/build.txt" >&2; echo "socket_figure.sh: building Loom failed" >&2; exit 1; }
fi
for t in tools/loomrun perf/all_reduce_perf; do
  [ -x "$build/$t" ] || { echo "socket_figure.sh: $build/$t is missing (drop --no-build)" >&2; exit 1; }
done
have_mpi=1 have_iperf=1
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
  echo "-- skipping Open MPI: mpirun or mpicc not found (Debian packages openmpi-bin libopenmpi-dev)"
  have_mpi=0
elif ! mpicc -O2 -std=c11 -o "$tmp/mpi_coll" perf/baselines/mpi_coll.c; then
  echo "-- skipping Open MPI: perf/baselines/mpi_coll.c does not build"
  have_mpi=0
fi
if ! command -v iperf3 >/dev/null; then
  echo "-- skipping iperf3: not found (Debian package iperf3)"
  have_iperf=0
else
  port=$((20000 + RANDOM % 20000))
  iperf3 -s -B 127.0.0.1 -p $port >"$tmp/iperf-server.txt" 2>&1 &
  iperf_pid=$!
  for _ in $(seq 50); do # until it listens
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    sleep 0.1
  done
fi

loom_bw() { # the out-of-place busbw of the one size
  env $extra NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo timeout 300 "$build/tools/loomrun" -n 2 \
    "$build/perf/all_reduce_perf" -b "$bytes" -e "$bytes" -n "$iters" -w 3 -c 0 2>&1 |
    awk -v b="$bytes" '$1 == b {print $8; exit}'
}
loom_lat() { # 8 B AllReduce, out-of-place time in us
  env $extra NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo timeout 300 "$build/tools/loomrun" -n 2 \
    "$build/perf/all_reduce_perf" -b 8 -e 8 -n 2000 -w 100 -c 0 2>&1 | awk '$1 == 8 {print $6; exit}'
}
mpi_bw() { # GB/s busbw ("coll size time algbw busbw")
  timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include lo "$tmp/mpi_coll" allreduce "$bytes" "$bytes" 2 3 "$iters" 2>/dev/null |
    awk '$1 == "allreduce" {print $5; exit}'
}
iperf_bw() { # GB/s (10^9 bytes) of one stream for 3 s
  iperf3 -c 127.0.0.1 -p $port -t 3 -J 2>/dev/null |
    awk -F: '/"bits_per_second"/ {v = $2} END {gsub(/[^0-9.e+]/, "", v); if (v != "") printf "%.2f\n", v / 8e9}'
}

echo "== $(nproc) CPUs, $(uname -r); AllReduce float32 $size, 2 processes over loopback, $rounds rounds${extra:+; $extra}"
: >"$tmp/loom" >"$tmp/lat" >"$tmp/mpi" >"$tmp/iperf"
for r in $(seq "$rounds"); do
  line="round $r (load $(cut -d' ' -f1 /proc/loadavg)):"
  v=$(loom_bw); echo "${v:-nan}" >>"$tmp/loom"; line="$line loom ${v:-fail} GB/s"
  if [ $have_iperf -eq 1 ]; then v=$(iperf_bw); echo "${v:-nan}" >>"$tmp/iperf"; line="$line, iperf3 ${v:-fail} GB/s"; fi
  if [ $have_mpi -eq 1 ]; then v=$(mpi_bw); echo "${v:-nan}" >>"$tmp/mpi"; line="$line, mpi tcp ${v:-fail} GB/s"; fi
  v=$(loom_lat); echo "${v:-nan}" >>"$tmp/lat"; line="$line, loom 8 B ${v:-fail} us"
  echo "$line"
done

median() { grep -v nan "$1" | sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2); else print "nan"}'; }
loom=$(median "$tmp/loom") lat=$(median "$tmp/lat")
echo "== medians: Loom socket busbw $loom GB/s, Loom 8 B AllReduce $lat us"
if [ $have_iperf -eq 1 ]; then
  ip=$(median "$tmp/iperf")
  awk -v l="$loom" -v i="$ip" 'BEGIN {printf "   iperf3 one stream %s GB/s: Loom / iperf3 = %.2f (target >= 0.70)\n", i, l / i}'
fi
if [ $have_mpi -eq 1 ]; then
  mp=$(median "$tmp/mpi")
  awk -v l="$loom" -v m="$mp" 'BEGIN {printf "   Open MPI btl tcp %s GB/s: Loom / MPI = %.2f (target >= 2)\n", m, l / m}'
fi
