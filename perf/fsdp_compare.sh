#!/usr/bin/env bash
# FSDP2 step time, loom against gloo (examples/fsdp_train.py: a 4-block
# transformer, 14.1 MiB of parameters, fully_shard per block, the same seed,
# both backends in each run), for 2 and 4 processes and batches of 32-token
# sequences per rank, each configuration run `reps` times: medians of the
# step times and of the runs' ratios, and the profiler's share of the step
# with an AllGather or ReduceScatter in flight (perf/train_compare.sh does
# the work; docs/pytorch.md has the figures).
#   perf/fsdp_compare.sh [build-dir] [reps] [batches] [ranks]
#   perf/fsdp_compare.sh build 5 "1 4" "2 4"    (STEPS=N timed steps per run, 20)
# The Python: $LOOM_TORCH_PYTHON, else ~/.cache/loom-ci/torch-2.15.0.
set -euo pipefail
exec "$(dirname "$0")/train_compare.sh" fsdp "${1:-build}" "${2:-5}" "${3:-1 4}" "${4:-2 4}"
