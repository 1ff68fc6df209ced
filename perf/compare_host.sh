#!/usr/bin/env bash
# Loom against Open MPI 4.1, Intel MPI 2021 and PyTorch's Gloo on this host,
# in one run: builds Loom and the baselines, then runs each library in turn,
# round after round, and prints the medians with peer/Loom time ratios
# (above 1: Loom is faster). Figures on a VM drift 1.5-2x between runs
# minutes apart, so only libraries interleaved in the same run are compared.
#
#   perf/compare_host.sh [--ranks "2 4 8"] [--min 8] [--max 256M] [--factor 2]
#       [--rounds 3] [--colls "allreduce allgather reducescatter"]
#       [--peers "loom loom_win loom_socket mpi_shm impi_shm mpi_tcp gloo floor_exchange"] [--warmup 5]
#       [--iters 20] [--timeout 1200] [--out perf-results] [--build build-perf]
#       [--no-build] [--impi DIR] [--gloo-python PY]
#   perf/compare_host.sh --quick [--rounds 3] [--peers ...] [--timeout ...]
#       [--out ...] [--build ...] [--no-build] [--impi DIR] [--gloo-python PY]
#
# Full mode: for each rank count, AllReduce (float32 sum), AllGather and
# ReduceScatter over every size. --quick: AllReduce (float32 sum) alone on
# fixed rows, each run at its own size, warmup and calls picked per size:
#   shm rows, Loom over shm against Open MPI (vader), Intel MPI (shm), Gloo:
#     2 ranks 8, 64K, 1M, 64M; 4 ranks 8, 1M, 64M; 8 ranks 8, 1M, 64M
#     (and Loom with its buffers in symmetric windows, all_reduce_perf -R 2,
#     a column of its own: loom_win, quick mode only; and on the 2-rank
#     rows, the floor of any AllReduce on plain buffers between two
#     processes, perf/baselines/shm_floor.c exchange: floor_exchange,
#     quick mode only, set against Loom and the MPIs below the table)
#   socket rows, Loom over sockets against Open MPI (tcp), Gloo:
#     2 ranks 8, 64M; 4 ranks 1M
# and prints per row each library's time per call, the best peer and
# Loom's ratio against it (quick.csv, summary.txt); even rounds run each
# row's libraries in the reverse order. The options of the
# sweep (--ranks --min --max --factor --colls --warmup --iters) do not
# apply to it. Either mode exits 0 whatever the ratios, 1 if a run failed,
# 2 on a bad option. --no-build, or LOOM_PERF_BUILD=DIR, uses an existing
# build. --timeout bounds each run (seconds).
#
# Libraries: Loom over shared memory and over sockets on loopback
# (NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo), Open MPI over shared memory
# (btl self,vader) and over TCP on loopback (btl tcp,self), Intel MPI over
# shared memory (I_MPI_FABRICS=shm) from the Python environment --impi DIR,
# else LOOM_IMPI_DIR, else ${XDG_CACHE_HOME:-~/.cache}/loom-perf/impi, and
# Gloo (torch.distributed, CPU tensors) with the Python --gloo-python, else
# LOOM_GLOO_PYTHON, else Debian's /usr/bin/python3. A missing one is
# skipped with a line saying how to install it; nothing is installed.
# Results in the output directory: raw.csv (every run's figures), runs.csv
# (each run's duration and status), logs/, summary.txt, and busbw.png
# (full mode) or quick.csv (--quick).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
declare -A opt=()
while [ $# -gt 0 ]; do
  case $1 in
    --ranks | --min | --max | --factor | --rounds | --colls | --peers | --warmup | --iters | --timeout | --out | --build | --impi | --gloo-python)
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
quick=${opt[quick]:-}
if [ -n "$quick" ]; then
  for o in ranks min max factor colls warmup iters; do
    [ -z "${opt[$o]:-}" ] || { echo "compare_host.sh: --$o does not apply to --quick (its rows are fixed)" >&2; exit 2; }
  done
fi
ranks=${opt[ranks]:-2 4 8} min=${opt[min]:-8} max=${opt[max]:-256M}
factor=${opt[factor]:-2} rounds=${opt[rounds]:-3}
warmup=${opt[warmup]:-5} iters=${opt[iters]:-20}
colls=${opt[colls]:-allreduce allgather reducescatter}
[ -n "$quick" ] && colls=allreduce
peers=${opt[peers]:-loom loom_win loom_socket mpi_shm impi_shm mpi_tcp gloo floor_exchange}
# The windows' column and the 2-rank floor belong to the quick table alone.
if [ -z "$quick" ]; then
  for p in loom_win floor_exchange; do
    [[ " $peers " == *" $p "* ]] || continue
    [ -n "${opt[peers]:-}" ] && echo "-- $p belongs to the quick table alone (--quick): not run"
    peers=" $peers "
    peers=${peers/ $p / }
  done
fi
limit=${opt[timeout]:-1200} out=${opt[out]:-perf-results}
build=${opt[build]:-${LOOM_PERF_BUILD:-build-perf}}
impi=${opt[impi]:-${LOOM_IMPI_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/loom-perf/impi}}
py=${opt[gloo-python]:-${LOOM_GLOO_PYTHON:-/usr/bin/python3}}
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
  case $p in loom | loom_win | loom_socket | mpi_shm | impi_shm | mpi_tcp | gloo | floor_exchange) ;;
    *) die "unknown library $p" ;;
  esac
done
want() { [[ " $peers " == *" $1 "* ]]; }

mkdir -p "$out/bin" "$out/logs" || exit 1
out=$(cd "$out" && pwd)
# Results, not sources: git should not offer them for commit.
[ -e "$out/.gitignore" ] || echo '*' >"$out/.gitignore"
rm -f "$out"/logs/*.log "$out"/plot/*.dat "$out/busbw.png" "$out/summary.txt" "$out/quick.csv" "$out/rows.txt"
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
    cmake --build "$build" -j"$(nproc)" --target loomrun all_reduce_perf all_gather_perf reduce_scatter_perf shm_floor
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
impi_install="python3 -m venv $impi && $impi/bin/pip install --no-deps impi-rt==2021.19.0 impi-devel==2021.19.0"
if want impi_shm; then
  if [ ! -x "$impi/bin/mpiexec" ] || [ ! -x "$impi/bin/mpicc" ]; then
    skip impi_shm "no Intel MPI in $impi (--impi DIR or LOOM_IMPI_DIR); install it without root with: $impi_install (and Debian's libfabric1)"
  elif ! I_MPI_ROOT=$impi I_MPI_CC=${CC:-gcc} "$impi/bin/mpicc" -O2 -std=c11 -Wall -Wextra \
      -o "$out/bin/impi_coll" perf/baselines/mpi_coll.c >"$out/logs/impi_build.txt" 2>&1; then
    skip impi_shm "perf/baselines/mpi_coll.c does not build with $impi/bin/mpicc, see $out/logs/impi_build.txt"
  fi
fi
if want gloo; then
  if [ ! -x "$py" ]; then
    skip gloo "no $py (Debian packages python3 python3-torch, or --gloo-python PY naming a Python with torch)"
  elif ! torch_version=$("$py" -c 'import torch, torch.distributed as d; assert d.is_gloo_available(); print(torch.__version__)' 2>/dev/null); then
    skip gloo "$py has no torch with gloo (Debian package python3-torch, or --gloo-python PY naming a Python with torch)"
  fi
fi
# The floor program is one of the build's benchmarks (perf/CMakeLists.txt).
if want floor_exchange && [ ! -x "$build/perf/shm_floor" ]; then
  skip floor_exchange "$build/perf/shm_floor is missing (a build older than it: drop --no-build, or build its shm_floor target)"
fi
if [ -z "$quick" ] && ! command -v gnuplot >/dev/null; then
  echo "-- no plot: gnuplot not found (Debian package gnuplot-nox); the tables still come"
fi
# The tables need only Python's standard library.
summ_py=/usr/bin/python3
[ -x $summ_py ] || summ_py=python3

# Intel MPI runs with its own defaults but for the fabric: ranks pinned one
# per core in turn (8 ranks on 2 cores: 4 on each), I_MPI_WAIT_MODE unset.
# Unset is not 0: it lets Intel MPI see more ranks than cores and stop
# polling, while I_MPI_WAIT_MODE=0 spelled out keeps 4 and 8 ranks polling
# (5.4 ms per 8 B call on 4 ranks, not 5 us); I_MPI_WAIT_MODE=1 triples
# 2 ranks' small calls; unpinned ranks (I_MPI_PIN=0) measured the same as
# pinned. perf/README.md has the figures. I_MPI_* set in the environment
# pass through.
impi_env=(I_MPI_ROOT="$impi" I_MPI_FABRICS=shm LD_LIBRARY_PATH="$impi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
impi_said="I_MPI_FABRICS=shm, I_MPI_PIN=${I_MPI_PIN:-(default: on)}, I_MPI_WAIT_MODE=${I_MPI_WAIT_MODE:-(unset: auto)}"

{
  echo "started $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), $(nproc) cores, $(uname -r)"
  echo "Loom $(git describe --always --dirty 2>/dev/null || echo '(no git)') built in $build;" \
    "Open MPI $(want mpi_shm || want mpi_tcp && mpirun --version 2>/dev/null | sed -n '1s/.* //p' || echo -);" \
    "Intel MPI $(want impi_shm && env "${impi_env[@]}" "$impi/bin/mpiexec" --version 2>/dev/null | sed -n '1s/.*Version \([^ ]*\).*/\1/p' || echo -)" \
    "($(want impi_shm && echo "$impi_said" || echo -));" \
    "torch ${torch_version:--}${torch_version:+ ($py)}"
  if [ -n "$quick" ]; then
    echo "quick rows (AllReduce float32 sum, warmup + timed calls per size); rounds: $rounds"
  else
    echo "ranks: $ranks; sizes $minb..$maxb B by $factor; $warmup warmup + $iters timed calls; rounds: $rounds"
  fi
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
  elif [ "$5" = floor ]; then
    awk -v p="$1,$2,$3,$4" '$1 == "shm_floor" && NF == 7 { print p "," $3 "," $5 ",,," }' "$6"
  else
    awk -v p="$1,$2,$3,$4" 'NF == 5 && $2 ~ /^[0-9]+$/ { print p "," $2 "," $3 "," $5 ",," }' "$6"
  fi >>"$raw"
}

logtag= # the quick mode's size, in the log's name
runone() { # impl coll n round format command...
  local impl=$1 coll=$2 n=$3 r=$4 fmt=$5 t0=$SECONDS rc status before=
  shift 5
  local log="$out/logs/${impl}_${coll}_${n}r${logtag}_round$r.log"
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
  printf '   %-12s %-13s %3d s  %s\n' "$impl" "$coll${logtag:+ ${logtag#_}}" $((SECONDS - t0)) "$status"
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

# One library's run of one collective on n ranks, sizes lo..hi by factor.
runlib() { # impl coll n round lo hi factor warmup iters
  local impl=$1 coll=$2 n=$3 r=$4 lo=$5 hi=$6 f=$7 w=$8 it=$9
  local tool=$build/perf/${loom_tool[$coll]} args=(-b "$lo" -e "$hi" -f "$f" -w "$w" -n "$it")
  # Open MPI's own ranks get no binding (more ranks than cores) and the
  # ob1 PML, so that the BTLs named are the ones carrying the data.
  local mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" --mca pml ob1)
  case $impl in
    loom) runone loom "$coll" "$n" "$r" nccl "$build/tools/loomrun" -n "$n" "$tool" "${args[@]}" ;;
    loom_win) runone loom_win "$coll" "$n" "$r" nccl "$build/tools/loomrun" -n "$n" "$tool" "${args[@]}" -R 2 ;;
    loom_socket)
      runone loom_socket "$coll" "$n" "$r" nccl env NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
        "$build/tools/loomrun" -n "$n" "$tool" "${args[@]}" ;;
    mpi_shm)
      runone mpi_shm "$coll" "$n" "$r" base "${mpi[@]}" --mca btl self,vader \
        "$out/bin/mpi_coll" "$coll" "$lo" "$hi" "$f" "$w" "$it" ;;
    mpi_tcp)
      runone mpi_tcp "$coll" "$n" "$r" base "${mpi[@]}" --mca btl tcp,self --mca btl_tcp_if_include lo \
        "$out/bin/mpi_coll" "$coll" "$lo" "$hi" "$f" "$w" "$it" ;;
    impi_shm)
      runone impi_shm "$coll" "$n" "$r" base env "${impi_env[@]}" "$impi/bin/mpiexec" -n "$n" \
        "$out/bin/impi_coll" "$coll" "$lo" "$hi" "$f" "$w" "$it" ;;
    # Its time is the calls' mean in the one round it runs.
    floor_exchange) runone floor_exchange "$coll" "$n" "$r" floor "$build/perf/shm_floor" exchange "$lo" "$it" 1 ;;
    gloo)
      [ -n "${said[gloo$coll$n]:-}" ] ||
        runone gloo "$coll" "$n" "$r" base env GLOO_SOCKET_IFNAME=lo "$py" \
          perf/baselines/gloo_coll.py "$coll" "$n" "$lo" "$hi" "$f" "$w" "$it" ;;
  esac
}

ncores=$(nproc)
start=$SECONDS
round_start() { # label round
  local load threads busy=''
  read -r load _ </proc/loadavg
  awk -v l="$load" -v c="$ncores" 'BEGIN { exit !(l > c / 2) }' &&
    busy="  (busy: load $load on $ncores cores, figures will suffer)"
  echo "== ${1}round $2 of $rounds, $((SECONDS - start)) s so far, load $load$busy"
  echo "round $1$2: load average $load at the start" >>"$meta"
  for threads in 1 2; do
    [ "$threads" -gt "$ncores" ] && continue
    [ -n "$quick" ] && [ "$threads" -lt "$((ncores < 2 ? ncores : 2))" ] && continue
    "$out/bin/memcpy_bw" 256 7 "$threads" |
      awk -v r="$2" '$1 == "memcpy" { print "memcpy,memcpy," $2 "," r "," $3 * 1048576 ",," $5 ",," }' >>"$raw"
  done
}

if [ -n "$quick" ]; then
  # The issue's rows: kind ranks size. Gloo, on TCP alone, is a peer of
  # both kinds; a size it shares between them is run once per round.
  quick_rows=("shm 2 8" "shm 2 64K" "shm 2 1M" "shm 2 64M" "shm 4 8" "shm 4 1M" "shm 4 64M"
    "shm 8 8" "shm 8 1M" "shm 8 64M" "socket 2 8" "socket 2 64M" "socket 4 1M")
  # Timed calls per row, the same for every library of the row: thousands
  # where a call takes microseconds, so that the mean per call settles, a
  # few where it takes tens of milliseconds; fewer as ranks (more time per
  # call on 2 cores) grow. Warmup: a tenth of them, at least 1.
  calls() { # ranks bytes -> "warmup iters"
    local it
    if [ "$2" -le 4096 ]; then it=$((10000 / $1))
    elif [ "$2" -le 262144 ]; then it=$((2000 / $1))
    elif [ "$2" -le 4194304 ]; then it=$((400 / $1))
    else it=$((20 / $1 > 5 ? 20 / $1 : 5)); fi
    echo "$((it / 10 > 1 ? it / 10 : 1)) $it"
  }
  row_libs() { # kind ranks -> the libraries of its rows that are wanted
    local l libs="loom loom_win mpi_shm impi_shm gloo" on=
    [ "$1" = shm ] && [ "$2" = 2 ] && libs+=" floor_exchange"
    [ "$1" = socket ] && libs="loom_socket mpi_tcp gloo"
    for l in $libs; do want "$l" && on+=" $l"; done
    echo "$on"
  }
  echo "row,kind,ranks,bytes,warmup,iters" >"$out/rows.txt"
  for row in "${quick_rows[@]}"; do
    read -r kind n size <<<"$row"
    b=$(bytes "$size") && read -r w it <<<"$(calls "$n" "$b")"
    [ -n "$(row_libs "$kind" "$n")" ] && echo "$kind-${n}r-$size,$kind,$n,$b,$w,$it" >>"$out/rows.txt"
  done
  for r in $(seq 1 "$rounds"); do
    round_start "" "$r"
    declare -A done_here=()
    for row in "${quick_rows[@]}"; do
      read -r kind n size <<<"$row"
      b=$(bytes "$size") && read -r w it <<<"$(calls "$n" "$b")"
      logtag=_$size
      # Every other round runs a row's libraries in the reverse order: a
      # row's first run follows the previous row's (an 8-rank 64 MiB run
      # before the socket rows) and can come out slow on a busy host, so
      # no library should always be first.
      libs=$(row_libs "$kind" "$n")
      [ $((r % 2)) -eq 1 ] || libs=$(echo "$libs" | tr ' ' '\n' | tac | tr '\n' ' ')
      for impl in $libs; do
        [ -z "${done_here[$impl $n $b]:-}" ] || continue
        done_here[$impl $n $b]=1
        runlib "$impl" allreduce "$n" "$r" "$b" "$b" 2 "$w" "$it"
      done
    done
    unset done_here
  done
  logtag=
else
  for n in $ranks; do
    for r in $(seq 1 "$rounds"); do
      round_start "$n ranks, " "$r"
      for coll in $colls; do
        for impl in loom loom_socket mpi_shm impi_shm mpi_tcp gloo; do
          want $impl && runlib $impl "$coll" "$n" "$r" "$minb" "$maxb" "$factor" "$warmup" "$iters"
        done
      done
    done
  done
fi
echo "finished after $((SECONDS - start)) s of runs" >>"$meta"
echo "== runs done in $((SECONDS - start)) s; raw figures in $raw"
echo
if [ -n "$quick" ]; then
  $summ_py perf/baselines/quick_table.py "$out" || failures=$((failures + 1))
else
  $summ_py perf/baselines/summarize.py "$out" || failures=$((failures + 1))
fi
[ $failures -eq 0 ] || { echo "compare_host.sh: $failures run(s) failed, see runs.csv and logs/" >&2; exit 1; }
