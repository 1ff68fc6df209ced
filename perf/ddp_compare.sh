#!/usr/bin/env bash
# DDP step time, loom against gloo (examples/ddp_train.py: the same MLP with
# 16.1 MiB of gradients, the same seed, both backends in each run), for 2
# and 4 processes and several batch sizes per rank, each configuration run
# `reps` times; prints the median step time of each backend and the median
# of the runs' ratios. Usage:
#   perf/ddp_compare.sh [build-dir] [reps] [batches] [ranks]
#   perf/ddp_compare.sh build 7 "1 4 16" "2 4"     (STEPS=N: timed steps per run, 20)
#   DDP_ARGS=--no-bucket-view perf/ddp_compare.sh ...   (more options for every run)
# At these batches a step is mostly memory traffic over the weights
# (forward and backward products, the optimizer) plus the gradients'
# AllReduce, the only part the backend changes (docs/pytorch.md).
set -euo pipefail
build=${1:-build}
reps=${2:-3}
steps=${STEPS:-20}
batches=${3:-"1 4 16"}
ranks=${4:-"2 4"}
py=${LOOM_TORCH_PYTHON:-/usr/bin/python3}
export PYTHONPATH="$build/bindings/torch${PYTHONPATH:+:$PYTHONPATH}"
export LOOM_NCCL_LIB=${LOOM_NCCL_LIB:-$build/libnccl.so.2}
here=$(dirname "$0")

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# DDP step time, loom against gloo: $reps runs per line, medians (examples/ddp_train.py --steps $steps ${DDP_ARGS:-})"
echo "# host: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); BLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)"
printf '%6s %6s %12s %12s %8s   %s\n' ranks batch "gloo ms" "loom ms" ratio "ratios of the runs"
for n in $ranks; do
  for b in $batches; do
    g=() l=() x=()
    for ((i = 0; i < reps; i++)); do
      out=$("$py" "$here/../examples/ddp_train.py" --ranks "$n" --batch "$b" --steps "$steps" --warmup 2 ${DDP_ARGS:-})
      g+=("$(awk '$1 == "gloo:" { print $2 }' <<<"$out")")
      l+=("$(awk '$1 == "loom:" { print $2 }' <<<"$out")")
      x+=("$(awk '/^loom is / { sub(/x$/, "", $3); print $3 }' <<<"$out")")
    done
    printf '%6s %6s %12s %12s %7sx   %s\n' "$n" "$b" "$(median "${g[@]}")" "$(median "${l[@]}")" "$(median "${x[@]}")" "${x[*]}"
  done
done
