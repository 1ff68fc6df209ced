"""Loom as a torch.distributed backend on CPU tensors.

    import loom_torch                      # registers the backend "loom"
    import torch.distributed as dist
    dist.init_process_group("loom", rank=rank, world_size=n, init_method=...)

The extension (_C, built by CMake next to this file in
<build>/bindings/torch/loom_torch) links Loom's libnccl.so.2. When
LOOM_NCCL_LIB names a library file, that one is loaded first (the same
variable bindings/python/loom.py reads), so it serves the extension's
libnccl.so.2 whatever the library search path says.

SPDX-License-Identifier: Apache-2.0
"""

import ctypes
import os

import torch.distributed as dist

_lib = os.environ.get("LOOM_NCCL_LIB")
if _lib:
    # RTLD_GLOBAL: the extension's libnccl.so.2 dependency is then
    # satisfied by this already-loaded library (matched by soname).
    ctypes.CDLL(_lib, mode=ctypes.RTLD_GLOBAL)

from . import _C  # noqa: E402  (after torch.distributed, whose ProcessGroup it extends)

ProcessGroupLoom = _C.ProcessGroupLoom
BACKEND = "loom"


def nccl_version():
    """ncclGetVersion of the Loom library in use (22700 for NCCL 2.27)."""
    return _C.nccl_version()


def transports():
    """The transports this Loom was built with, e.g. "shm net/socket"."""
    return _C.transports()


def _create(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, _create)
