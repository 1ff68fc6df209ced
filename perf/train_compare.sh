#!/usr/bin/env bash
# What perf/ddp_compare.sh and perf/fsdp_compare.sh share: runs an example
# (examples/ddp_train.py or examples/fsdp_train.py; both backends train in
# the same processes, one step each in turn) for each process count and
# batch, `reps` times, alternating which backend the run starts with, and
# prints the median step time of each backend, the median of the runs'
# gloo/loom ratios, and the medians of the profiler's share of the step
# with a collective in flight (--profile: AllReduce, AllGather,
# ReduceScatter; a separate few steps per run, not the timed ones).
# Usage: perf/train_compare.sh ddp|fsdp [build-dir] [reps] [batches] [ranks]
#   STEPS=N timed steps per run; ARGS="..." more options for every run.
# The Python is $LOOM_TORCH_PYTHON, else CI's torch 2.15 virtual
# environment (~/.cache/loom-ci/torch-2.15.0), else python3.
set -euo pipefail
kind=$1
build=${2:-build}
reps=${3:-5}
batches=${4:-}
ranks=${5:-"2 4"}
steps=${STEPS:-20}
venv=${XDG_CACHE_HOME:-$HOME/.cache}/loom-ci/torch-2.15.0/bin/python
if [ -n "${LOOM_TORCH_PYTHON:-}" ]; then py=$LOOM_TORCH_PYTHON
elif [ -x "$venv" ]; then py=$venv
else py=python3; fi
export PYTHONPATH="$build/bindings/torch${PYTHONPATH:+:$PYTHONPATH}"
export LOOM_NCCL_LIB=${LOOM_NCCL_LIB:-$build/libnccl.so.2}
here=$(dirname "$0")
example=$here/../examples/${kind}_train.py
[ -f "$example" ] || { echo "no $example (the first argument: ddp or fsdp)" >&2; exit 2; }

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# "gloo"|"loom", field 1-4 (all, AllReduce, AllGather, ReduceScatter) of the profiler line, in %
share() { sed -n "s/^ *$1: profiler.*: \([0-9]*\)% (all_reduce \([0-9]*\)% all_gather \([0-9]*\)% reduce_scatter \([0-9]*\)%).*/\1 \2 \3 \4/p" <<<"$2" | cut -d' ' -f"$3"; }
shares() {  # backend, then the runs' outputs in the array named out_all
  local f k v=()
  for f in 1 2 3 4; do
    k=()
    for o in "${out_all[@]}"; do k+=("$(share "$1" "$o" "$f")"); done
    v+=("$(median "${k[@]}")")
  done
  echo "${v[0]}% (${v[1]}/${v[2]}/${v[3]})"
}

torch_version=$("$py" -c 'import torch; print(torch.__version__)')
echo "# $kind step time, loom against gloo: $reps runs per line, medians (examples/${kind}_train.py --steps $steps --profile ${ARGS:-})"
echo "# host: $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), load $(cut -d' ' -f1-3 /proc/loadavg); torch $torch_version ($py)"
echo "# comm: the profiler's share of the step with a collective in flight, all (AllReduce/AllGather/ReduceScatter)"
printf '%5s %5s %10s %10s %7s  %-20s %-20s %s\n' ranks batch "gloo ms" "loom ms" ratio "gloo comm" "loom comm" "ratios of the runs"
for n in $ranks; do
  for b in $batches; do
    g=() l=() x=() out_all=()
    for ((i = 0; i < reps; i++)); do
      order=gloo,loom
      ((i % 2)) && order=loom,gloo
      out=$(nice "$py" "$example" --ranks "$n" --batch "$b" --steps "$steps" --warmup 2 --backends "$order" \
            --profile ${ARGS:-} 2>&1 | grep -v 'gpuGetDeviceCount\|SyncActivityProfilerHandler\|^$') \
        || { echo "run failed (ranks $n batch $b):" >&2; echo "$out" >&2; exit 1; }
      out_all+=("$out")
      g+=("$(awk '$1 == "gloo:" && $3 == "ms" { print $2 }' <<<"$out")")
      l+=("$(awk '$1 == "loom:" && $3 == "ms" { print $2 }' <<<"$out")")
      x+=("$(awk '/^loom is / { sub(/x$/, "", $3); print $3 }' <<<"$out")")
    done
    printf '%5s %5s %10s %10s %6sx  %-20s %-20s %s\n' "$n" "$b" "$(median "${g[@]}")" "$(median "${l[@]}")" \
      "$(median "${x[@]}")" "$(shares gloo)" "$(shares loom)" "${x[*]}"
  done
done
