"""Loom as a torch.distributed backend on CPU tensors.

    import loom_torch                      # registers the backend "loom"
    import torch.distributed as dist
    dist.init_process_group("loom", rank=rank, world_size=n, init_method=...)

The extension (_C, built by CMake next to this file in
<build>/bindings/torch/loom_torch, or by `pip install --no-build-isolation
./bindings/torch`) loads Loom's libnccl.so.2 by path when imported: the
one it was built against, or the file LOOM_NCCL_LIB names (the variable
bindings/python/loom.py reads too). It never binds to another
libnccl.so.2 that torch has loaded.

SPDX-License-Identifier: Apache-2.0
"""

import torch.distributed as dist

from . import _C  # noqa: E402  (after torch.distributed, whose Backend it extends)

ProcessGroupLoom = _C.ProcessGroupLoom
BACKEND = "loom"


def nccl_version():
    """ncclGetVersion of the Loom library in use (22700 for NCCL 2.27)."""
    return _C.nccl_version()


def library_path():
    """The path of the Loom library the backend loaded."""
    return _C.library_path()


def transports():
    """The transports this Loom was built with, e.g. "shm net/socket"."""
    return _C.transports()


def _create(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
