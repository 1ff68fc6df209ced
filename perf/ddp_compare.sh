#!/usr/bin/env bash
# DDP step time, loom against gloo (examples/ddp_train.py: an MLP with 16.1
# MiB of gradients, the same seed, both backends in each run), for 2 and 4
# processes and several batch sizes per rank, each configuration run `reps`
# times: medians of the step times and of the runs' ratios, and the
# profiler's share of the step with an AllReduce in flight
# (perf/train_compare.sh does the work; docs/pytorch.md has the figures).
#   perf/ddp_compare.sh [build-dir] [reps] [batches] [ranks]
#   perf/ddp_compare.sh build 5 "1 16" "2 4"    (STEPS=N timed steps per run, 20)
#   ARGS=--no-bucket-view perf/ddp_compare.sh ...   (more options for every run)
# The Python: $LOOM_TORCH_PYTHON, else ~/.cache/loom-ci/torch-2.15.0.
set -euo pipefail
exec "$(dirname "$0")/train_compare.sh" ddp "${1:-build}" "${2:-5}" "${3:-1 16}" "${4:-2 4}"
