#!/usr/bin/env bash
# The device check, second run: what tests/gpu/run.sh leaves out because it
# is slower or needs more of the machine: GPUDirect RDMA through the verbs
# test double, what loom-info sees on the GPU machine, and whether torch
# imports and sees the GPU.
#
#   tests/gpu/run2.sh [--dry-run] [output-dir]
#
# Same structure as run.sh (tests/gpu/lib.sh): one log per step in the
# output folder (argument, $OUT, ./gpu-out), summary.txt, a last status
# line, non-zero exit when a step failed, --dry-run to print the plan. It
# too must fit ONE device call of at most 9 minutes (540 s), so every step
# has a timeout and they add up to at most the 530 s deadline.
#
# It builds the same way as run.sh; a build folder left by run.sh on a warm
# machine is reused, and the build then takes seconds.
set -uo pipefail
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init "$@"

step gpu_info 10 "nvidia-smi -L; rc=\$?; nvidia-smi --query-gpu=name,compute_mode,driver_version --format=csv; \
pgrep -a nvidia-cuda-mps || echo 'no MPS'; exit \$rc"

# loom_tests brings the verbs test double along where infiniband/verbs.h is.
build_loom nccl loom_tests loom-info

# What the gpu_net_gdr_* tests will find: without the test double they
# skip, without nvidia-peermem GDR needs dma-buf export. Information only.
step gdr_prereqs 5 "ls $B/tests/libloom-verbs-double.so || \
echo 'no verbs test double (no infiniband/verbs.h): gpu_net_gdr_* skip'; \
ls -d /sys/module/nvidia_peermem 2>/dev/null || echo 'nvidia-peermem is not loaded: GDR needs dma-buf export'; true"

# What discovery (NVML, sysfs) sees here, and its dump, before the long
# steps: it takes seconds and says what the GDR tests run on.
step loom_info 15 "$B/tools/loom-info --ranks 2 --dump $OUTDIR/topo.xml"

# GPUDirect RDMA, one test per step so that a hang with GDR on still
# leaves time for half on and off, which say whether GDR is the cause.
step gpu_net_gdr_on 130 "$(ctest_cmd '^gpu_net_gdr_on$')"
step gpu_net_gdr_read_off 90 "$(ctest_cmd '^gpu_net_gdr_read_off$')"
step gpu_net_gdr_off 90 "$(ctest_cmd '^gpu_net_gdr_off$')"

# torch: only whether it imports and sees the GPU; exits 77 (skipped) where
# python3 has no torch. The torch backend's GPU test (PyTorch's nccl
# backend served by Loom) is the third run's (tests/gpu/run3.sh).
# The python3 is the one bindings/torch/CMakeLists.txt takes (LOOM_TORCH_PYTHON,
# default /usr/bin/python3 with Debian's python3-torch): one earlier on PATH,
# such as pyenv's, may have no torch.
PY=${LOOM_TORCH_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
step torch_check 45 "if $PY -c 'import torch' 2>/dev/null; then \
$PY -c 'import torch; print(\"torch.__version__:\", torch.__version__); \
print(\"torch.cuda.is_available():\", torch.cuda.is_available())'; \
else echo 'skipped: $PY cannot import torch'; exit 77; fi"

finish
