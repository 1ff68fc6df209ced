#!/usr/bin/env bash
# The device check, third run: PyTorch's own "nccl" backend on CUDA
# tensors, served by Loom's libnccl.so.2 (LD_PRELOAD), with the torch the
# GPU machine has installed (2.11 when this was written): every collective
# torch.distributed offers, all_to_all_single, gather, scatter and
# send/recv, checked against the host's answer, on one GPU with one rank
# and with two ranks as processes (bindings/torch/tests/gpu_nccl_backend.py).
#
#   tests/gpu/run3.sh [--dry-run] [output-dir]
#
# Same structure as run.sh (tests/gpu/lib.sh): one log per step, a
# summary, non-zero exit when a step failed, --dry-run to print the plan;
# ONE device call of at most 9 minutes. A build folder left by run.sh on a
# warm machine is reused.
set -uo pipefail
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init "$@"

step gpu_info 10 "nvidia-smi -L"

build_loom nccl

# The GPU machine's python3 with its torch: the one on PATH unless
# LOOM_TORCH_PYTHON says otherwise.
PY=${LOOM_TORCH_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}
step torch_check 30 "$PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \
\"nccl built against\", torch.cuda.nccl.version(), \"device\", torch.cuda.is_available())'"

# The script exits 77 (skipped) without torch, CUDA or a device; its own
# --timeout fires before the step's, so a hang names the rank.
BACKEND="env LOOM_NCCL_LIB=$B/libnccl.so.2 PYTHONDONTWRITEBYTECODE=1 $PY bindings/torch/tests/gpu_nccl_backend.py"
step torch_backend_1 120 "$BACKEND --ranks 1 --timeout 110"
step torch_backend_2 200 "$BACKEND --ranks 2 --timeout 190"

finish
