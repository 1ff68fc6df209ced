#!/usr/bin/env bash
# The device check: on a machine with a GPU, build Loom with CUDA and run
# every GPU test and benchmark, in well under 10 minutes.
#   tests/gpu/run.sh [output-dir]
# Writes each step's output to the output dir (default: $OUT or ./gpu-out)
# and prints a summary; exits non-zero if a test failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-gpu-out}}
mkdir -p "$out"
build=build-gpu
jobs=$(nproc)
status=0
step() { # name, command...
  local name=$1; shift
  echo "== $name: $*" | tee -a "$out/summary.txt"
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  tail -n 25 "$out/$name.log"
  [ $rc -eq 0 ] || status=1
}
nvidia-smi -L >"$out/gpu.txt" 2>&1 || true
cat "$out/gpu.txt"
step configure cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA_ARCHS=90
step build cmake --build $build -j"$jobs"
# The gpu_net_gdr_* tests run GPUDirect RDMA through the verbs test double,
# built only where infiniband/verbs.h is; say what they will find.
{ ls $build/tests/libloom-verbs-double.so || echo "no verbs test double (no infiniband/verbs.h): gpu_net_gdr_* skip"
  ls -d /sys/module/nvidia_peermem 2>/dev/null || echo "nvidia-peermem is not loaded: GDR needs dma-buf export"
} 2>&1 | tee -a "$out/summary.txt"
# What discovery (NVML, sysfs) sees on the GPU machine, and its dump.
step loom_info $build/tools/loom-info --ranks 2 --dump "$out/topo.xml"
step gpu_tests ctest --test-dir $build -R '^gpu_' --output-on-failure --timeout 400
step host_smoke ctest --test-dir $build -R '^(smoke_|p2p_ring_shm_2|coll_shm_2|unit_)' --output-on-failure
step cuda_allreduce_1 $build/examples/cuda_allreduce --ranks 1
step cuda_allreduce_4 $build/examples/cuda_allreduce --ranks 4 --count 16777216
step pipeline_parallel_4 $build/examples/pipeline_parallel --ranks 4 --steps 5
step reduce_kernel_bw $build/perf/reduce_kernel_bw 256 20
step all_reduce_1 $build/perf/all_reduce_perf -b 8 -e 256M -f 4 -g 1 -w 5 -n 20
step all_reduce_2 $build/tools/loomrun -n 2 --timeout 300 $build/perf/all_reduce_perf -b 8 -e 256M -f 4 -g 1 -w 5 -n 20
step all_reduce_4 $build/tools/loomrun -n 4 --timeout 300 $build/perf/all_reduce_perf -b 8 -e 64M -f 8 -g 1 -w 3 -n 10
step all_gather_2 $build/tools/loomrun -n 2 --timeout 200 $build/perf/all_gather_perf -b 8 -e 64M -f 8 -g 1 -w 3 -n 10
step sendrecv_2 $build/tools/loomrun -n 2 --timeout 200 $build/perf/sendrecv_perf -b 8 -e 64M -f 8 -g 1 -w 3 -n 10
echo "== done, status $status" | tee -a "$out/summary.txt"
exit $status
