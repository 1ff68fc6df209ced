#!/usr/bin/env bash
# `pip install --no-build-isolation ./bindings/torch`, the user's one
# command, run for real: into a private directory (pip --target), against
# the torch of $1 and a Loom found through LOOM_HOME (an install prefix made
# of links to this build); then two ranks import that package, without
# LOOM_NCCL_LIB (the extension must load the Loom it was built against,
# not the libnccl.so.2 torch loaded), and all_reduce. Usage: pip_install.sh PYTHON BUILD_DIR SOURCE_DIR
# Exit 77 (skipped) where that Python has no pip or setuptools.
set -euo pipefail
py=$1 build=$2 src=$3
{ "$py" -m pip --version && "$py" -c 'import setuptools, torch'; } >/dev/null 2>&1 || { echo "SKIP: $py lacks pip, setuptools or torch"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/home/lib"
ln -s "$(readlink -f "$build/libnccl.so.2")" "$tmp/home/lib/libnccl.so.2"
ln -s "$src/include" "$tmp/home/include"
cp -r "$src/bindings/torch" "$tmp/pkg"
rm -rf "$tmp/pkg/tests" "$tmp/pkg/build"
LOOM_HOME="$tmp/home" "$py" -m pip install -q --no-build-isolation --no-deps --no-cache-dir --target "$tmp/site" "$tmp/pkg"
unset LOOM_NCCL_LIB
cd "$tmp" # not the build tree, whose loom_torch would be found first
PYTHONPATH="$tmp/site" "$py" - "$(readlink -f "$build/libnccl.so.2")" <<'PY'
import os, sys, tempfile
import torch.multiprocessing as mp

def rank(r, path, want_lib):
    import torch, torch.distributed as dist
    import loom_torch
    assert loom_torch.__file__.startswith(os.environ["PYTHONPATH"]), loom_torch.__file__
    # torch's CUDA wheels load NVIDIA's libnccl.so.2 too; the backend's is Loom's
    assert os.path.realpath(loom_torch.library_path()) == want_lib, (loom_torch.library_path(), want_lib)
    assert any(os.path.realpath(l.split()[-1]) == want_lib for l in open("/proc/self/maps") if "libnccl" in l)
    assert loom_torch.transports(), "no transports"
    dist.init_process_group("loom", init_method="file://" + path, rank=r, world_size=2)
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), 3.0)), t
    dist.destroy_process_group()

path = os.path.join(tempfile.mkdtemp(), "store")
mp.start_processes(rank, args=(path, sys.argv[1]), nprocs=2, start_method="fork", join=True)
print("pip-installed loom_torch: all_reduce over 2 ranks with", sys.argv[1])
PY
echo PASS
