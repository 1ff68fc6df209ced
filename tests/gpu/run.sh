#!/usr/bin/env bash
# The device check, first run: on a machine with one GPU (an H200, 16
# cores), build Loom with CUDA and run the GPU tests, the compute
# sanitizers and the bandwidth figures.
#
#   tests/gpu/run.sh [--dry-run] [output-dir]
#
# Output folder: the argument, else $OUT, else ./gpu-out. Each step's full
# output goes to <folder>/<step>.log, one line per step (name, rc, seconds)
# to <folder>/summary.txt; the tail of each log is printed as it ends, then
# the summary and a last line with the overall status. Exits non-zero when
# a step failed. --dry-run prints each step's command and timeout and the
# planned total, and runs nothing.
#
# It must fit ONE device call of at most 9 minutes (540 s). Every step has
# its own timeout and the steps' timeouts add up to at most the 530 s
# deadline (tests/gpu/lib.sh), so a hang costs one step, not the run. A
# failed step does not stop the script (the later ones still teach
# something), except the build, which everything needs.
#
# Order: what teaches most first, so that a run cut short still says the
# most it can:
#   1. does anything run at all: the GPU and its mode as the driver sees
#      it, the build, the CUDA example on one rank;
#   2. correctness on one rank: the collective matrix;
#   3. the compute sanitizers on that one rank (memory, shared-memory
#      races, barriers), while the run is still simple;
#   4. ordering and several ranks: stream order, a mismatched call, ranks
#      as threads of one process, then two processes, then the rest;
#   5. speed: the reduce kernel against cudaMemcpy, all_reduce_perf.
# GPUDirect RDMA and torch take longer and need other things from the
# machine: they are the second run's (tests/gpu/run2.sh).
set -uo pipefail
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init "$@"

# compute-sanitizer comes with the CUDA toolkit, which is not always on PATH.
find_sanitizer() {
  local p
  for p in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
    /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if [ -n "$p" ] && [ -x "$p" ]; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# One rank of the CUDA example under one sanitizer tool. The example forks
# its rank, hence --target-processes all; a small count because racecheck
# and synccheck slow every kernel down many times. The rank's own alarm
# (--timeout) goes off before the step's, so a hang names the rank.
sanitize() { # tool seconds
  local tool=$1 secs=$2
  if [ -z "$SANITIZER" ] && [ "$DRY" = 0 ]; then
    skip_step "sanitize_$tool" "no compute-sanitizer on PATH or in /usr/local/cuda/bin"
    return
  fi
  step "sanitize_$tool" "$secs" "${SANITIZER:-compute-sanitizer} --tool $tool --target-processes all --error-exitcode 1 \
$B/examples/cuda_allreduce --ranks 1 --count 65536 --timeout $((secs - 5))"
}

# 1. The GPU, its compute mode and whether MPS serves it: several ranks on
# one GPU behave differently under EXCLUSIVE_PROCESS or MPS.
step gpu_info 10 "nvidia-smi -L; rc=\$?; nvidia-smi --query-gpu=name,compute_mode,driver_version --format=csv; \
pgrep -a nvidia-cuda-mps || echo 'no MPS'; exit \$rc"

# 2. Only what the steps below run (loom_tests brings loomrun, loom-info
# and the benchmarks along as its dependencies), with every core.
build_loom nccl loom_tests cuda_allreduce all_reduce_perf reduce_kernel_bw loomrun

# 3. The smallest program a user writes: does a CUDA communicator work.
step cuda_allreduce_1 20 "$B/examples/cuda_allreduce --ranks 1 --timeout 15"

# 4. Every collective, type, op and count on one rank.
step gpu_coll_1 45 "$(ctest_cmd '^gpu_coll_1$')"

# 5. The sanitizers: bad accesses first, then races, then barriers.
SANITIZER=$(find_sanitizer) || SANITIZER=
if [ "$DRY" = 1 ] && [ -z "$SANITIZER" ]; then
  echo "    (no compute-sanitizer here: a real run here would skip steps $((NSTEP + 1))-$((NSTEP + 3)))"
fi
sanitize memcheck 40
sanitize racecheck 40
sanitize synccheck 30

# 6. The collective in stream order with the user's other work.
step gpu_stream_order 20 "$(ctest_cmd '^gpu_stream_order$')"

# 7. A mismatched call surfaces as an asynchronous error, not a hang.
step gpu_mismatch 25 "$(ctest_cmd '^gpu_mismatch$')"

# 8. Several ranks of one process on one GPU. gpu_threads_* may not exist
# yet: the regex must not fail for it.
step gpu_threads 25 "$(ctest_cmd '^gpu_(init_all_shared|threads_.*)$') $NO_TESTS"

# 9. Two processes on the GPU: p2p through CUDA IPC.
step gpu_coll_2 45 "$(ctest_cmd '^gpu_coll_2$')"

# 10. The remaining GPU tests. Not here: the GPUDirect RDMA ones (run2.sh),
# and gpu_torch_*, the torch backend's GPU test (issue 24's, up to 400 s).
step gpu_rest 50 "$(ctest_cmd '^gpu_' '^gpu_(coll_1|coll_2|stream_order|mismatch|init_all_shared|threads_.*|net_gdr.*|torch_.*)$')"

# 11. Speed: the reduce kernel against the device's own copy (256 MiB, 20
# iterations), then AllReduce on one GPU up to 256 MiB, and two ranks
# through the launcher on a shorter range.
step reduce_kernel_bw 10 "$B/perf/reduce_kernel_bw 256 20"
step all_reduce_1 15 "$B/perf/all_reduce_perf -b 8 -e 256M -f 4 -g 1 -w 5 -n 20"
step all_reduce_2 15 "$B/tools/loomrun -n 2 --timeout 12 $B/perf/all_reduce_perf -b 8 -e 32M -f 4 -g 1 -w 3 -n 10"

finish
