#!/bin/sh
# NVIDIA's nccl-tests, its current head, builds unchanged against Loom's
# nccl.h and links against Loom's libnccl.so.2 (issue 23): every *_perf is
# made, its -Wall -Wextra prints no warning, and the header it compiled
# with is Loom's (API level 2.27: its Gather is a group of ncclSend and
# ncclRecv, where a 2.28 header would call ncclGather). The CUDA toolkit
# ships NVIDIA's own nccl.h, which must not be the one used. Skips (77)
# without the sources (LOOM_NCCL_TESTS_SRC, which .ci/run clones) or nvcc.
#   usage: nccl_tests_build.sh <Loom's include dir> <Loom's libnccl.so.2> <nvcc>
set -u
inc=$(readlink -f "$1")
lib=$(readlink -f "$2")
nvcc=${3:-}
src=${LOOM_NCCL_TESTS_SRC:-}
if [ -z "$src" ] || [ ! -f "$src/src/Makefile" ]; then
  echo "SKIP: no nccl-tests sources here (set LOOM_NCCL_TESTS_SRC to a clone of github.com/NVIDIA/nccl-tests)"
  exit 77
fi
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
  echo "SKIP: no nvcc (nccl-tests is CUDA C++)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src" "$work/src"
mkdir -p "$work/home/lib"
ln -s "$inc" "$work/home/include"
ln -s "$lib" "$work/home/lib/libnccl.so"
ln -s "$lib" "$work/home/lib/libnccl.so.2"
cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
echo "nccl-tests $(git -C "$src" log -1 --format='%h %s' 2>/dev/null) against $inc"
if ! make -C "$work/src/src" -j2 NCCL_HOME="$work/home" CUDA_HOME="$cuda_home" \
     NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$work/build" >"$work/log" 2>&1; then
  tail -40 "$work/log"
  echo "FAIL: nccl-tests does not build against Loom's header"
  exit 1
fi
if grep -i "warning" "$work/log"; then
  echo "FAIL: the build printed warnings (above)"
  exit 1
fi
n=$(ls "$work"/build/*_perf 2>/dev/null | wc -l)
echo "built $n benchmarks: $(cd "$work/build" && ls *_perf | tr '\n' ' ')"
if [ "$n" -lt 10 ]; then
  echo "FAIL: expected at least 10 *_perf"
  exit 1
fi
if nm "$work/build/gather.o" | grep -q " U ncclGather$"; then
  echo "FAIL: gather.o calls ncclGather: it was compiled against a 2.28+ header, not Loom's"
  exit 1
fi
nm "$work/build/gather.o" | grep -q " U ncclSend$" || { echo "FAIL: gather.o does not call ncclSend"; exit 1; }
echo PASS
