#!/usr/bin/env bash
# Loom against Open MPI 4.1 and PyTorch's Gloo on this host, in one run:
# builds Loom and the baselines, then for each rank count runs AllReduce
# (float32 sum), AllGather and ReduceScatter over every size with each
# library in turn, round after round, and prints the medians with
# peer/Loom time ratios (above 1: Loom is faster). Figures on a VM drift
# 1.5-2x between runs minutes apart, so only libraries interleaved in the
# same run are compared.
#
#   perf/compare_host.sh [--ranks "2 4 8"] [--min 8] [--max 256M] [--factor 2]
#       [--rounds 3] [--colls "allreduce allgather reducescatter"]
#       [--peers "loom loom_socket mpi_shm mpi_tcp gloo"] [--warmup 5] [--iters 20]
#       [--timeout 1200] [--out perf-results] [--build build-perf] [--no-build] [--quick]
#
# --quick: 2 ranks, 8 B to 1 MiB by 16, 1 round, 2+10 iterations (options
# given too win, wherever they are). --no-build, or LOOM_PERF_BUILD=DIR,
# uses an existing build. --timeout bounds each run (seconds).
#
# Libraries: Loom over shared memory and over sockets on loopback
# (NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo), Open MPI over shared memory
# (btl self,vader) and over TCP on loopback (btl tcp,self), Gloo
# (torch.distributed, CPU tensors) with Debian's /usr/bin/python3. A
# missing one is skipped with a line naming its Debian package; nothing is
# installed. Results in the output directory: raw.csv (every run's
# figures), runs.csv (each run's duration and status), logs/, summary.txt,
# busbw.png.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
declare -A opt=()
while [ $# -gt 0 ]; do
  case $1 in
    --ranks | --min | --max | --factor | --rounds | --colls | --peers | --warmup | --iters | --timeout | --out | --build)
      [ $# -ge 2 ] || { echo "compare_host.sh: $1 needs a value" >&2; exit 2; }
      opt[${1#--}]=$2
      shift ;;
    --no-build) opt[nobuild]=1 ;;
    --quick) opt[quick]=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare_host.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "${opt[quick]:-}" ]; then
  def_ranks=2 def_min=8 def_max=1M def_factor=16 def_rounds=1 def_warmup=2 def_iters=10
else
  def_ranks="2 4 8" def_min=8 def_max=256M def_factor=2 def_rounds=3 def_warmup=5 def_iters=20
fi
ranks=${opt[ranks]:-$def_ranks} min=${opt[min]:-$def_min} max=${opt[max]:-$def_max}
factor=${opt[factor]:-$def_factor} rounds=${opt[rounds]:-$def_rounds}
warmup=${opt[warmup]:-$def_warmup} iters=${opt[iters]:-$def_iters}
colls=${opt[colls]:-allreduce allgather reducescatter}
peers=${opt[peers]:-loom loom_socket mpi_shm mpi_tcp gloo}
limit=${opt[timeout]:-1200} out=${opt[out]:-perf-results}
build=${opt[build]:-${LOOM_PERF_BUILD:-build-perf}}
do_build=1
[ -n "${opt[nobuild]:-}" ] || [ -n "${LOOM_PERF_BUILD:-}" ] && do_build=0

die() { echo "compare_host.sh: $*" >&2; exit 2; }
bytes() { # 8, 64K, 256M, 1G -> bytes
  local n=${1%[KkMmGg]}
  [[ $n =~ ^[0-9]+$ ]] || die "bad size $1"
  case $1 in
    *[Kk]) echo $((n << 10)) ;; *[Mm]) echo $((n << 20)) ;; *[Gg]) echo $((n << 30)) ;; *) echo "$n" ;;
  esac
}
minb=$(bytes "$min") || exit 2
maxb=$(bytes "$max") || exit 2
for v in factor rounds warmup iters limit; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--$v needs a number, not '${!v}'"
done
[ "$factor" -ge 2 ] && [ "$rounds" -ge 1 ] && [ "$iters" -ge 1 ] && [ "$minb" -ge 1 ] && [ "$maxb" -ge "$minb" ] ||
  die "need --factor >= 2, --rounds >= 1, --iters >= 1, 1 <= --min <= --max"
for n in $ranks; do [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || die "--ranks takes counts >= 2, not '$n'"; done
for c in $colls; do
  case $c in allreduce | allgather | reducescatter) ;; *) die "unknown collective $c" ;; esac
done
for p in $peers; do
  case $p in loom | loom_socket | mpi_shm | mpi_tcp | gloo) ;; *) die "unknown library $p" ;; esac
done
want() { [[ " $peers " == *" $1 "* ]]; }

mkdir -p "$out/bin" "$out/logs" || exit 1
out=$(cd "$out" && pwd)
# Results, not sources: git should not offer them for commit.
[ -e "$out/.gitignore" ] || echo '*' >"$out/.gitignore"
rm -f "$out"/logs/*.log "$out"/plot/*.dat "$out/busbw.png" "$out/summary.txt"
raw=$out/raw.csv runs=$out/runs.csv skipped=$out/skipped.txt meta=$out/meta.txt
echo "impl,coll,ranks,round,size,time_us,busbw,inplace_time_us,inplace_busbw" >"$raw"
echo "impl,coll,ranks,round,seconds,status" >"$runs"
: >"$skipped"

# Every temporary file of the run (Gloo's file store, Open MPI's session
# directory) goes under one directory, removed on the way out.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-compare.XXXXXX") || exit 1
export TMPDIR=$tmp
child=
cleanup() { rm -rf "$tmp"; }
# timeout(1) puts the run in its own process group, out of reach of the
# terminal's Ctrl-C, so the signal is passed on by hand.
on_signal() {
  trap - INT TERM
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null && wait "$child"
  cleanup
  echo "compare_host.sh: interrupted; partial results in $out" >&2
  exit 130
}
trap cleanup EXIT
trap on_signal INT TERM

# ---- builds
if [ $do_build -eq 1 ]; then
  command -v cmake >/dev/null || die "cmake is missing (apt-get install cmake)"
  echo "== building Loom (Release, no CUDA) in $build"
  { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_CUDA=OFF &&
    cmake --build "$build" -j"$(nproc)" --target loomrun all_reduce_perf all_gather_perf reduce_scatter_perf
  } >"$out/logs/build.txt" 2>&1 || { echo "compare_host.sh: building Loom failed, see $out/logs/build.txt" >&2; exit 1; }
fi
for t in tools/loomrun perf/all_reduce_perf perf/all_gather_perf perf/reduce_scatter_perf; do
  [ -x "$build/$t" ] || die "$build/$t is missing (drop --no-build / LOOM_PERF_BUILD, or build it)"
done
cc=${CC:-cc}
$cc -O2 -std=c11 -Wall -Wextra -pthread -o "$out/bin/memcpy_bw" perf/baselines/memcpy_bw.c ||
  { echo "compare_host.sh: cannot build perf/baselines/memcpy_bw.c" >&2; exit 1; }

skip() { # impl reason: for every collective and rank count
  local c n
  echo "-- skipping $1: $2"
  for c in $colls; do for n in $ranks; do echo "$1 $c $n $2" >>"$skipped"; done; done
  peers=" $peers "
  peers=${peers/ $1 / }
}
if want mpi_shm || want mpi_tcp; then
  if ! command -v mpirun >/dev/null; then
    skip mpi_shm "mpirun not found (Debian package openmpi-bin)"
    skip mpi_tcp "mpirun not found (Debian package openmpi-bin)"
  elif ! command -v mpicc >/dev/null; then
    skip mpi_shm "mpicc not found (Debian package libopenmpi-dev)"
    skip mpi_tcp "mpicc not found (Debian package libopenmpi-dev)"
  elif ! mpicc -O2 -std=c11 -Wall -Wextra -o "$out/bin/mpi_coll" perf/baselines/mpi_coll.c; then
    skip mpi_shm "perf/baselines/mpi_coll.c does not build"
    skip mpi_tcp "perf/baselines/mpi_coll.c does not build"
  fi
fi
py=/usr/bin/python3
if want gloo; then
  if [ ! -x $py ]; then
    skip gloo "no $py (Debian packages python3 python3-torch)"
  elif ! torch_version=$($py -c 'import torch, torch.distributed as d; assert d.is_gloo_available(); print(torch.__version__)' 2>/dev/null); then
    skip gloo "$py has no torch with gloo (Debian package python3-torch)"
  fi
fi
if ! command -v gnuplot >/dev/null; then
  echo "-- no plot: gnuplot not found (Debian package gnuplot-nox); the tables still come"
fi
summ_py=$py
[ -x $py ] || summ_py=python3

{
  echo "started $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), $(nproc) cores, $(uname -r)"
  echo "Loom $(git describe --always --dirty 2>/dev/null || echo '(no git)') built in $build;" \
    "Open MPI $(want mpi_shm || want mpi_tcp && mpirun --version 2>/dev/null | sed -n '1s/.* //p' || echo -);" \
    "torch ${torch_version:--}"
  echo "ranks: $ranks; sizes $minb..$maxb B by $factor; $warmup warmup + $iters timed calls; rounds: $rounds"
} >"$meta"

# ---- runs
declare -A loom_tool=([allreduce]=all_reduce_perf [allgather]=all_gather_perf [reducescatter]=reduce_scatter_perf)
failures=0
declare -A said=()

# Rows from nccl-tests output (out-of-place time and busbw, then in-place)
# or from the baselines' "coll size time_us algbw busbw".
record() { # impl coll n round format log
  if [ "$5" = nccl ]; then
    awk -v p="$1,$2,$3,$4" '/^ *[0-9]+ +[0-9]+ / && NF >= 13 { print p "," $1 "," $6 "," $8 "," $10 "," $12 }' "$6"
  else
    awk -v p="$1,$2,$3,$4" 'NF == 5 && $2 ~ /^[0-9]+$/ { print p "," $2 "," $3 "," $5 ",," }' "$6"
  fi >>"$raw"
}

runone() { # impl coll n round format command...
  local impl=$1 coll=$2 n=$3 r=$4 fmt=$5 t0=$SECONDS rc status before=
  shift 5
  local log="$out/logs/${impl}_${coll}_${n}r_round$r.log"
  [[ $impl == mpi_* ]] && before=$(ls /dev/shm 2>/dev/null)
  timeout -k 10 "$limit" "$@" >"$log" 2>&1 </dev/null &
  child=$!
  wait $child
  rc=$?
  child=
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out after $limit s" ;;
    3) [ "$impl" = gloo ] && status=unsupported || status="exit 3" ;;
    *) status="exit $rc" ;;
  esac
  printf '   %-12s %-13s %3d s  %s\n' "$impl" "$coll" $((SECONDS - t0)) "$status"
  echo "$impl,$coll,$n,$r,$((SECONDS - t0)),$status" >>"$runs"
  if [ "$status" = unsupported ]; then
    if [ -z "${said[$impl$coll$n]:-}" ]; then
      said[$impl$coll$n]=1
      echo "$impl $coll $n unsupported by torch $torch_version: $(sed -n 's/^[a-z]* unsupported: //p' "$log" | head -1)" >>"$skipped"
    fi
  elif [ "$status" != ok ]; then
    failures=$((failures + 1))
    echo "      see $log"
    # Open MPI removes its shared-memory segments on the way out, which a
    # killed run skips: remove those this run left behind.
    if [ -n "$before" ]; then
      comm -13 <(sort <<<"$before") <(ls /dev/shm 2>/dev/null | sort) | grep '^vader_segment\.' |
        while read -r f; do rm -f "/dev/shm/$f"; done
    fi
  fi
  record "$impl" "$coll" "$n" "$r" "$fmt" "$log"
}

ncores=$(nproc)
start=$SECONDS
for n in $ranks; do
  for r in $(seq 1 "$rounds"); do
    read -r load _ </proc/loadavg
    busy=
    awk -v l="$load" -v c="$ncores" 'BEGIN { exit !(l > c / 2) }' &&
      busy="  (busy: load $load on $ncores cores, figures will suffer)"
    echo "== $n ranks, round $r of $rounds, $((SECONDS - start)) s so far, load $load$busy"
    echo "round $n ranks $r: load average $load at the start" >>"$meta"
    for threads in 1 2; do
      [ "$threads" -gt "$ncores" ] && continue
      "$out/bin/memcpy_bw" 256 7 "$threads" |
        awk -v r="$r" '$1 == "memcpy" { print "memcpy,memcpy," $2 "," r "," $3 * 1048576 ",," $5 ",," }' >>"$raw"
    done
    args=(-b "$minb" -e "$maxb" -f "$factor" -w "$warmup" -n "$iters")
    # Open MPI's own ranks get no binding (more ranks than cores) and the
    # ob1 PML, so that the BTLs named are the ones carrying the data.
    mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" --mca pml ob1)
    for coll in $colls; do
      tool=$build/perf/${loom_tool[$coll]}
      want loom &&
        runone loom "$coll" "$n" "$r" nccl "$build/tools/loomrun" -n "$n" "$tool" "${args[@]}"
      want loom_socket &&
        runone loom_socket "$coll" "$n" "$r" nccl env NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
          "$build/tools/loomrun" -n "$n" "$tool" "${args[@]}"
      want mpi_shm &&
        runone mpi_shm "$coll" "$n" "$r" base "${mpi[@]}" --mca btl self,vader \
          "$out/bin/mpi_coll" "$coll" "$minb" "$maxb" "$factor" "$warmup" "$iters"
      want mpi_tcp &&
        runone mpi_tcp "$coll" "$n" "$r" base "${mpi[@]}" --mca btl tcp,self --mca btl_tcp_if_include lo \
          "$out/bin/mpi_coll" "$coll" "$minb" "$maxb" "$factor" "$warmup" "$iters"
      if want gloo && [ -z "${said[gloo$coll$n]:-}" ]; then
        runone gloo "$coll" "$n" "$r" base env GLOO_SOCKET_IFNAME=lo $py \
          perf/baselines/gloo_coll.py "$coll" "$n" "$minb" "$maxb" "$factor" "$warmup" "$iters"
      fi
    done
  done
done
echo "finished after $((SECONDS - start)) s of runs" >>"$meta"
echo "== runs done in $((SECONDS - start)) s; raw figures in $raw"
echo
$summ_py perf/baselines/summarize.py "$out" || failures=$((failures + 1))
[ $failures -eq 0 ] || { echo "compare_host.sh: $failures run(s) failed, see runs.csv and logs/" >&2; exit 1; }
