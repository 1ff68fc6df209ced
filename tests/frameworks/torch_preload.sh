#!/bin/sh
# PyTorch from PyPI on Loom: `import torch` with Loom's libnccl.so.2 in
# LD_PRELOAD, as docs/pytorch.md tells users to swap it in. torch's RPATH
# names its own nvidia/nccl/lib, and the pip layout may load NVIDIA's
# libnccl.so.2 by path as well; every nccl* symbol libtorch_cuda.so binds
# must still bind to Loom's. Skips (77) unless LOOM_PYPI_TORCH_PYTHON names the
# python of a virtual environment with torch installed (.ci/run makes one).
#   usage: torch_preload.sh /path/to/loom/libnccl.so.2
set -u
lib=$(readlink -f "$1")
py=${LOOM_PYPI_TORCH_PYTHON:-}
if [ -z "$py" ] || [ ! -x "$py" ]; then
  echo "SKIP: no PyTorch from PyPI here (set LOOM_PYPI_TORCH_PYTHON to a venv's python with torch installed)"
  exit 77
fi
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "SKIP: $py cannot import torch"
  exit 77
fi
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
# The loader writes its bindings to $log/b.<pid>; torch prints its version
# and what ncclGetVersion answers in the process (Loom's level, 22700).
if ! LD_DEBUG=bindings LD_DEBUG_OUTPUT="$log/b" LD_PRELOAD="$lib" "$py" -c '
import ctypes, torch
v = ctypes.c_int()
assert ctypes.CDLL(None).ncclGetVersion(ctypes.byref(v)) == 0
print("torch", torch.__version__, "ncclGetVersion", v.value)
' >"$log/out" 2>&1; then
  echo "FAIL: import torch with Loom preloaded:"
  cat "$log/out"
  exit 1
fi
cat "$log/out" | grep -v Warning
all=$(cat "$log"/b.* | grep "binding file [^ ]*libtorch_cuda.so" | grep -c "normal symbol .nccl")
loom=$(cat "$log"/b.* | grep "binding file [^ ]*libtorch_cuda.so" | grep "normal symbol .nccl" | grep -c " to $lib ")
echo "libtorch_cuda.so bound $loom of its $all nccl* symbols to $lib"
if [ "$all" -lt 40 ] || [ "$loom" -ne "$all" ]; then
  cat "$log"/b.* | grep "binding file [^ ]*libtorch_cuda.so" | grep "normal symbol .nccl" | grep -v " to $lib " | head
  echo "FAIL: not every nccl* symbol of libtorch_cuda.so binds to Loom"
  exit 1
fi
grep -q "ncclGetVersion 22700" "$log/out" || { echo "FAIL: ncclGetVersion in the process is not Loom's"; exit 1; }
echo PASS
