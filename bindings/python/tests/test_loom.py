"""Tests of bindings/python/loom.py. Each `test_*` function is one CTest
test (bindings/python/CMakeLists.txt reads their names from this file),
run as `python3 test_loom.py NAME` in a process of its own; ranks are
processes forked from it, each with a time limit.

SPDX-License-Identifier: Apache-2.0
"""

import multiprocessing as mp
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import loom  # noqa: E402

RANK_TIMEOUT_S = 60
DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64]


def _rank_main(fn, nranks, uid, rank, q):
    try:
        with loom.Communicator(nranks, uid, rank) as comm:
            fn(comm)
        q.put((rank, None))
    except BaseException:  # noqa: B902 - reported to the parent, whatever it is
        q.put((rank, traceback.format_exc()))


def run_ranks(nranks, fn):
    """Runs fn(comm) on nranks processes; raises if any failed or hung."""
    uid = loom.get_unique_id()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(fn, nranks, uid, r, q)) for r in range(nranks)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(nranks):
            rank, err = q.get(timeout=RANK_TIMEOUT_S)
            results[rank] = err
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    failed = {r: e for r, e in results.items() if e}
    if failed or len(results) != nranks:
        raise AssertionError("ranks failed: " + "".join(f"\n--- rank {r}:\n{e}" for r, e in sorted(failed.items()))
                             + ("" if len(results) == nranks else f"\n{nranks - len(results)} rank(s) never answered"))


def _values(dtype, n, rank):
    # Small integers, so every reduction is exact in every type.
    return ((np.arange(n) % 5) + rank + 1).astype(dtype)


def _all_reduce(comm):
    n, p = 1001, comm.size
    for dt in DTYPES:
        x = _values(dt, n, comm.rank)
        want = sum(_values(np.float64, n, r) for r in range(p))
        out = comm.all_reduce(x, np.empty_like(x))
        assert np.array_equal(out.astype(np.float64), want), (dt, out[:5], want[:5])
        y = _values(dt, n, comm.rank)
        comm.all_reduce(y, op="max")
        assert np.array_equal(y.astype(np.float64), _values(np.float64, n, p - 1)), dt
        z = _values(dt, n, comm.rank)
        comm.all_reduce(z, op="min")
        assert np.array_equal(z, _values(dt, n, 0)), dt


def test_all_reduce_2():
    run_ranks(2, _all_reduce)


def test_all_reduce_3():
    run_ranks(3, _all_reduce)


def _gathers(comm):
    p, r = comm.size, comm.rank
    for dt in (np.int32, np.float32, np.float64):
        x = np.full(37, r, dt)
        g = comm.all_gather(x)
        assert g.shape == (p, 37) and all((g[k] == k).all() for k in range(p)), g
        big = np.concatenate([np.full(11, r + k, dt) for k in range(p)])
        part = comm.reduce_scatter(big)
        want = sum(r2 + r for r2 in range(p))
        assert part.shape == (11,) and (part == want).all(), (part, want)


def test_gathers_3():
    run_ranks(3, _gathers)


def _rooted(comm):
    p, r = comm.size, comm.rank
    for root in range(p):
        b = np.full(100, r, np.int64)
        comm.broadcast(b, root=root)
        assert (b == root).all(), (root, b[:3])
        x = np.full(100, r + 1, np.float32)
        out = np.zeros(100, np.float32)
        comm.reduce(x, out, op="sum", root=root)
        if r == root:
            assert (out == p * (p + 1) / 2).all(), out[:3]


def test_rooted_3():
    run_ranks(3, _rooted)


def _ring(comm):
    p, r = comm.size, comm.rank
    out = np.zeros(4096, np.float64)
    with loom.group():
        comm.send(np.full(4096, r, np.float64), (r + 1) % p)
        comm.recv(out, (r - 1) % p)
    assert (out == (r - 1) % p).all(), out[:3]


def test_send_recv_ring_4():
    run_ranks(4, _ring)


def _split(comm):
    sub = comm.split(comm.rank % 2)
    x = np.array([comm.rank], np.int32)
    sub.all_reduce(x)
    want = sum(k for k in range(comm.size) if k % 2 == comm.rank % 2)
    assert x[0] == want and sub.size == (comm.size + 1 - comm.rank % 2) // 2, (x, sub.size)
    sub.destroy()
    assert comm.split(None) is None


def test_split_4():
    run_ranks(4, _split)


def _expect(exc, fn, *words):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def _errors(comm):
    x = np.zeros(8, np.float32)
    _expect(TypeError, lambda: comm.all_reduce([1.0, 2.0]), "numpy array")
    _expect(TypeError, lambda: comm.all_reduce(np.zeros(8, np.complex64)), "complex64")
    _expect(ValueError, lambda: comm.all_reduce(x, np.zeros(7, np.float32)), "7 elements")
    _expect(TypeError, lambda: comm.all_reduce(x, np.zeros(8, np.float64)), "float32", "float64")
    _expect(ValueError, lambda: comm.all_reduce(x, op="mean"), "'mean'")
    _expect(ValueError, lambda: comm.all_gather(x, np.zeros(8, np.float32)), "needs 2 x 8")
    _expect(ValueError, lambda: comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1]), "C-contiguous")
    # Loom's own sentence comes through.
    e = _expect(loom.LoomError, lambda: comm.broadcast(x, root=5), "root 5 is out of range")
    assert e.code == 4, e.code  # ncclInvalidArgument
    # The communicator still works after refused calls.
    y = np.ones(8, np.float32)
    comm.all_reduce(y)
    assert (y == comm.size).all(), y


def test_errors_2():
    run_ranks(2, _errors)


def test_unique_id_checked():
    _expect(ValueError, lambda: loom.Communicator(1, b"short", 0), "128 bytes")
    assert loom.version() >= 22700, loom.version()


if __name__ == "__main__":
    if len(sys.argv) != 2 or not callable(globals().get("test_" + sys.argv[1])):
        names = sorted(k[5:] for k, v in globals().items() if k.startswith("test_") and callable(v))
        sys.exit("usage: test_loom.py NAME, NAME one of: " + " ".join(names))
    globals()["test_" + sys.argv[1]]()
    print("PASS:", sys.argv[1])
