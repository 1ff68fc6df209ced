#!/usr/bin/env bash
# The device check for issue 25 (the GPU path at NVLink speed): on a
# machine with one GPU, the figures docs/gpu-performance.md's model
# predicts, measured, and the CUDA graph replays checked.
#
#   tests/gpu/run4.sh [--dry-run] [output-dir]
#
# Same structure as run.sh (tests/gpu/lib.sh): one log per step, a
# summary, non-zero exit when a step failed, --dry-run to print the plan;
# ONE device call of at most 9 minutes. A build folder left by an earlier
# run on a warm machine is reused.
#
# What each step answers:
#   - graphs: collectives captured once and replayed, on a real driver
#     (gpu_graph_replay_ll_2: LL ones among them);
#   - gpu_coll_pieces: the Simple loop with its handshake warp (gpu_pieces_*:
#     many pieces per step, Ring and Tree), where bar.sync/bar.arrive are real;
#   - gpu_ll: the LL protocol's tests (tests/test_gpu_ll.c) on real
#     hardware, where GPU memory ordering is weaker than the emulation's;
#   - reduce_kernel_bw: the reduce loop's bytes per second against
#     cudaMemcpy device to device (the issue's goal: at least 85%);
#   - one_lane: one block's AllReduce bus bandwidth (NCCL_MAX_NCHANNELS=1),
#     the model's per-lane figure;
#   - ar_<proto>: AllReduce of 2 ranks as threads of one process on the
#     one GPU at 8 B, 1 MiB and 256 MiB, with the Simple protocol and with
#     LL (NCCL_PROTO=LL forces LL at every size, 256 MiB included, where
#     it runs at about half the link rate; by default only calls up to
#     64 KiB take LL);
#   - ncu: one kernel launch under Nsight Compute, where it is installed.
set -uo pipefail
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init "$@"

step gpu_info 10 "nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv"

build_loom nccl loom_tests all_reduce_perf reduce_kernel_bw

step graphs 60 "$(ctest_cmd '^gpu_graph_')"
step gpu_coll_pieces 45 "$(ctest_cmd '^gpu_(coll_2|pieces_.*)$')"
step gpu_ll 45 "$(ctest_cmd '^gpu_ll_')"

step reduce_kernel_bw 15 "$B/perf/reduce_kernel_bw 256 20"

AR="$B/perf/all_reduce_perf -t 2 -g 1 -w 5 -n 20"
step one_lane 30 "NCCL_MAX_NCHANNELS=1 $AR -b 256M -e 256M"
SIZES="for b in 8 1M 256M; do $AR -b \$b -e \$b || exit 1; done"
step ar_simple 45 "export NCCL_PROTO=Simple; $SIZES"
step ar_ll 45 "export NCCL_PROTO=LL; $SIZES"

find_ncu() {
  local p
  for p in "$(command -v ncu 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/ncu" /usr/local/cuda/bin/ncu; do
    if [ -n "$p" ] && [ -x "$p" ]; then
      echo "$p"
      return 0
    fi
  done
  return 1
}
NCU=$(find_ncu) || NCU=
if [ -n "$NCU" ] || [ "$DRY" = 1 ]; then
  step ncu 90 "${NCU:-ncu} --launch-skip 5 --launch-count 1 -k regex:loom_kernel --section SpeedOfLight \
--section MemoryWorkloadAnalysis $AR -b 64M -e 64M -n 8"
else
  skip_step ncu "no ncu on PATH or in /usr/local/cuda/bin"
fi

finish
