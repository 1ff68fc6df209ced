"""Loom from Python without a framework: unique ids, host communicators and
the collectives on numpy arrays, through ctypes and Loom's libnccl.so.2.

The library is the one LOOM_NCCL_LIB names, else libnccl.so.2 as the
dynamic loader finds it (LD_LIBRARY_PATH). Buffers are C-contiguous numpy
arrays; their sizes are checked here, since the C API cannot see them.
Errors raise LoomError with Loom's own sentence (ncclGetLastError).

    uid = loom.get_unique_id()          # on one process, sent to the others
    with loom.Communicator(nranks, uid, rank) as comm:
        comm.all_reduce(x)              # in place, sum
        with loom.group():
            comm.send(a, peer=1)
            comm.recv(b, peer=1)

SPDX-License-Identifier: Apache-2.0
"""

import contextlib
import ctypes
import os

import numpy as np

UNIQUE_ID_BYTES = 128

# ncclResult_t
SUCCESS, IN_PROGRESS = 0, 7

_DTYPES = {
    np.dtype(np.int8): 0,
    np.dtype(np.uint8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.float64): 8,
}

OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


class LoomError(RuntimeError):
    """A Loom call failed: `code` is its ncclResult_t, the text Loom's sentence."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


_lib = None


def library():
    """The loaded libnccl (Loom's), loaded on first use."""
    global _lib
    if _lib is None:
        path = os.environ.get("LOOM_NCCL_LIB", "libnccl.so.2")
        lib = ctypes.CDLL(path)
        comm = ctypes.c_void_p
        size = ctypes.c_size_t
        buf = ctypes.c_void_p
        proto = {
            "ncclGetVersion": [ctypes.POINTER(ctypes.c_int)],
            "ncclGetUniqueId": [ctypes.POINTER(_UniqueId)],
            "ncclCommInitRank": [ctypes.POINTER(comm), ctypes.c_int, _UniqueId, ctypes.c_int],
            "ncclCommDestroy": [comm],
            "ncclCommAbort": [comm],
            "ncclCommSplit": [comm, ctypes.c_int, ctypes.c_int, ctypes.POINTER(comm), ctypes.c_void_p],
            "ncclCommCount": [comm, ctypes.POINTER(ctypes.c_int)],
            "ncclCommUserRank": [comm, ctypes.POINTER(ctypes.c_int)],
            "ncclAllReduce": [buf, buf, size, ctypes.c_int, ctypes.c_int, comm, ctypes.c_void_p],
            "ncclAllGather": [buf, buf, size, ctypes.c_int, comm, ctypes.c_void_p],
            "ncclReduceScatter": [buf, buf, size, ctypes.c_int, ctypes.c_int, comm, ctypes.c_void_p],
            "ncclBroadcast": [buf, buf, size, ctypes.c_int, ctypes.c_int, comm, ctypes.c_void_p],
            "ncclReduce": [buf, buf, size, ctypes.c_int, ctypes.c_int, ctypes.c_int, comm, ctypes.c_void_p],
            "ncclSend": [buf, size, ctypes.c_int, ctypes.c_int, comm, ctypes.c_void_p],
            "ncclRecv": [buf, size, ctypes.c_int, ctypes.c_int, comm, ctypes.c_void_p],
            "ncclGroupStart": [],
            "ncclGroupEnd": [],
        }
        for name, args in proto.items():
            f = getattr(lib, name)
            f.argtypes = args
            f.restype = ctypes.c_int
        lib.ncclGetLastError.argtypes = [comm]
        lib.ncclGetLastError.restype = ctypes.c_char_p
        lib.ncclGetErrorString.argtypes = [ctypes.c_int]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def _check(code, comm=None):
    if code != SUCCESS:
        lib = library()
        msg = lib.ncclGetLastError(comm) or lib.ncclGetErrorString(code)
        raise LoomError(code, msg.decode(errors="replace"))


def version():
    v = ctypes.c_int()
    _check(library().ncclGetVersion(ctypes.byref(v)))
    return v.value


def get_unique_id():
    """A new unique id, as 128 bytes to hand to every rank. The process that
    makes it runs the bootstrap root: it must live until all ranks joined."""
    uid = _UniqueId()
    _check(library().ncclGetUniqueId(ctypes.byref(uid)))
    return bytes(uid)


@contextlib.contextmanager
def group():
    """ncclGroupStart/ncclGroupEnd: the calls inside run together at the end.
    The arrays they use are kept alive until then."""
    _check(library().ncclGroupStart())
    _group_keep.append([])
    ok = False
    try:
        yield
        ok = True
    finally:
        keep = _group_keep.pop()
        code = library().ncclGroupEnd()
        del keep
        if ok:
            _check(code)


_group_keep = []


def _array(a, name, writable=False):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} is read-only")
    if a.dtype not in _DTYPES:
        raise TypeError(f"{name} has dtype {a.dtype}; Loom takes " + ", ".join(str(d) for d in _DTYPES))
    if _group_keep:
        _group_keep[-1].append(a)
    return a.ctypes.data_as(ctypes.c_void_p)


def _op(op):
    if op not in OPS:
        raise ValueError(f"op {op!r} is not one of {', '.join(OPS)}")
    return OPS[op]


def _same_type(a, b, what):
    if a.dtype != b.dtype:
        raise TypeError(f"{what}: sendbuf is {a.dtype} but recvbuf is {b.dtype}")


class Communicator:
    """A host communicator of `nranks` ranks, this being `rank`."""

    def __init__(self, nranks, unique_id, rank, _handle=None):
        self._h = ctypes.c_void_p(_handle) if _handle else ctypes.c_void_p()
        if _handle is None:
            if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != UNIQUE_ID_BYTES:
                raise ValueError(f"unique_id must be the {UNIQUE_ID_BYTES} bytes get_unique_id() returned")
            uid = _UniqueId()
            ctypes.memmove(ctypes.addressof(uid), bytes(unique_id), UNIQUE_ID_BYTES)
            _check(library().ncclCommInitRank(ctypes.byref(self._h), nranks, uid, rank))
        n, r = ctypes.c_int(), ctypes.c_int()
        _check(library().ncclCommCount(self._h, ctypes.byref(n)), self._h)
        _check(library().ncclCommUserRank(self._h, ctypes.byref(r)), self._h)
        self.size, self.rank = n.value, r.value

    def _live(self):
        if not self._h:
            raise LoomError(4, "the communicator was destroyed")
        return self._h

    def all_reduce(self, sendbuf, recvbuf=None, op="sum"):
        recvbuf = sendbuf if recvbuf is None else recvbuf
        s, d = _array(sendbuf, "sendbuf"), _array(recvbuf, "recvbuf", True)
        _same_type(sendbuf, recvbuf, "all_reduce")
        if recvbuf.size != sendbuf.size:
            raise ValueError(f"all_reduce: recvbuf has {recvbuf.size} elements, sendbuf {sendbuf.size}")
        _check(library().ncclAllReduce(s, d, sendbuf.size, _DTYPES[sendbuf.dtype], _op(op), self._live(), None),
               self._h)
        return recvbuf

    def all_gather(self, sendbuf, recvbuf=None):
        if recvbuf is None:
            recvbuf = np.empty((self.size,) + sendbuf.shape, sendbuf.dtype)
        s, d = _array(sendbuf, "sendbuf"), _array(recvbuf, "recvbuf", True)
        _same_type(sendbuf, recvbuf, "all_gather")
        if recvbuf.size != sendbuf.size * self.size:
            raise ValueError(f"all_gather: recvbuf has {recvbuf.size} elements; it needs {self.size} x "
                             f"{sendbuf.size}")
        _check(library().ncclAllGather(s, d, sendbuf.size, _DTYPES[sendbuf.dtype], self._live(), None), self._h)
        return recvbuf

    def reduce_scatter(self, sendbuf, recvbuf=None, op="sum"):
        if sendbuf.size % self.size:
            raise ValueError(f"reduce_scatter: sendbuf's {sendbuf.size} elements do not split in {self.size}")
        if recvbuf is None:
            recvbuf = np.empty(sendbuf.size // self.size, sendbuf.dtype)
        s, d = _array(sendbuf, "sendbuf"), _array(recvbuf, "recvbuf", True)
        _same_type(sendbuf, recvbuf, "reduce_scatter")
        if recvbuf.size * self.size != sendbuf.size:
            raise ValueError(f"reduce_scatter: recvbuf has {recvbuf.size} elements; it needs "
                             f"{sendbuf.size // self.size}")
        _check(library().ncclReduceScatter(s, d, recvbuf.size, _DTYPES[sendbuf.dtype], _op(op), self._live(),
                                           None), self._h)
        return recvbuf

    def broadcast(self, buf, root=0):
        p = _array(buf, "buf", True)
        _check(library().ncclBroadcast(p, p, buf.size, _DTYPES[buf.dtype], root, self._live(), None), self._h)
        return buf

    def reduce(self, sendbuf, recvbuf=None, op="sum", root=0):
        recvbuf = sendbuf if recvbuf is None else recvbuf
        s, d = _array(sendbuf, "sendbuf"), _array(recvbuf, "recvbuf", True)
        _same_type(sendbuf, recvbuf, "reduce")
        if recvbuf.size != sendbuf.size:
            raise ValueError(f"reduce: recvbuf has {recvbuf.size} elements, sendbuf {sendbuf.size}")
        _check(library().ncclReduce(s, d, sendbuf.size, _DTYPES[sendbuf.dtype], _op(op), root, self._live(), None),
               self._h)
        return recvbuf

    def send(self, buf, peer):
        p = _array(buf, "buf")
        _check(library().ncclSend(p, buf.size, _DTYPES[buf.dtype], peer, self._live(), None), self._h)

    def recv(self, buf, peer):
        p = _array(buf, "buf", True)
        _check(library().ncclRecv(p, buf.size, _DTYPES[buf.dtype], peer, self._live(), None), self._h)
        return buf

    def split(self, color, key=None):
        """ncclCommSplit: None for the ranks that pass color=None."""
        out = ctypes.c_void_p()
        c = -1 if color is None else color
        _check(library().ncclCommSplit(self._live(), c, self.rank if key is None else key, ctypes.byref(out), None),
               self._h)
        return Communicator(0, None, 0, _handle=out.value) if out.value else None

    def destroy(self):
        if self._h:
            h, self._h = self._h, ctypes.c_void_p()
            _check(library().ncclCommDestroy(h))

    def abort(self):
        if self._h:
            h, self._h = self._h, ctypes.c_void_p()
            _check(library().ncclCommAbort(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.destroy()
        else:
            self.abort()
        return False
