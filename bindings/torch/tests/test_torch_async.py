"""Tests of the loom backend's torch 2.x behaviour (bindings/torch): Work
that runs on the group's own thread, futures, coalescing, timeouts, abort,
split_group, sparse and bitwise all_reduce, object collectives. Each
`test_*` function is one CTest test torch_NAME, run as
`python3 test_torch_async.py NAME`; ranks are processes (test_torch.py's
run_ranks), each with a time limit.

SPDX-License-Identifier: Apache-2.0
"""

import time
from datetime import timedelta

import torch
import torch.distributed as dist

import loom_torch  # noqa: F401  (registers "loom")
from test_torch import _expect, main, run_ranks


def _store():
    return dist.distributed_c10d._get_default_store()


# ---- asynchronous work ----

def _returns_before_peer_calls(rank, p):
    # Rank 0's call must return while rank 1 has not even made its own: rank
    # 1 waits for a key rank 0 sets only after its call returned. A backend
    # that ran the call in the caller's thread would never get there.
    t = torch.full((1 << 16,), float(rank + 1))
    if rank == 0:
        w = dist.all_reduce(t, async_op=True)
        assert not w.is_completed(), "completed before the peer called"
        _store().set("rank0_returned", "1")
        fut = w.get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2)
        w.wait()
        assert w.is_completed() and w.is_success()
        assert torch.equal(t, torch.full_like(t, 3.0)), t[:4]
        assert torch.equal(doubled.wait(), torch.full_like(t, 6.0))
    else:
        _store().wait(["rank0_returned"])
        dist.all_reduce(t)
        assert torch.equal(t, torch.full_like(t, 3.0)), t[:4]


def test_async_returns_before_peer_2():
    run_ranks(2, _returns_before_peer_calls)


def _many_in_flight(rank, p):
    # Many calls queued at once complete in order, each with its own result.
    ts = [torch.full((1000 + i,), float(rank + i)) for i in range(40)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for i, (t, w) in enumerate(zip(ts, works)):
        w.wait()
        want = sum(float(r + i) for r in range(p))
        assert torch.equal(t, torch.full_like(t, want)), (i, t[:2])


def test_async_many_in_flight_3():
    run_ranks(3, _many_in_flight)


# ---- coalescing ----

def _coalescing(rank, p):
    from torch.distributed.distributed_c10d import _coalescing_manager
    a, b = torch.full((10,), float(rank)), torch.full((7,), 2.0 * rank, dtype=torch.float64)
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    s = float(sum(range(p)))
    assert torch.equal(a, torch.full_like(a, s)) and torch.equal(b, torch.full_like(b, 2 * s)), (a, b)
    # all_gather_into_tensor and reduce_scatter_tensor, coalesced
    ins = [torch.full((3,), float(rank)), torch.full((5,), float(10 + rank))]
    outs = [torch.empty(3 * p), torch.empty(5 * p)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for o, n, base in zip(outs, (3, 5), (0, 10)):
        want = torch.cat([torch.full((n,), float(base + r)) for r in range(p)])
        assert torch.equal(o, want), (o, want)
    rs_in = [torch.arange(4 * p, dtype=torch.float32) + rank, torch.ones(2 * p)]
    rs_out = [torch.empty(4), torch.empty(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    want0 = sum(torch.arange(4 * p, dtype=torch.float32) + r for r in range(p))[4 * rank:4 * rank + 4]
    assert torch.equal(rs_out[0], want0) and torch.equal(rs_out[1], torch.full((2,), float(p))), rs_out
    # all_reduce_coalesced (the older API)
    xs = [torch.full((4,), float(rank)), torch.full((3,), 1.0)]
    dist.all_reduce_coalesced(xs)
    assert torch.equal(xs[0], torch.full((4,), s)) and torch.equal(xs[1], torch.full((3,), float(p))), xs


def test_coalescing_3():
    run_ranks(3, _coalescing)


def _batch_p2p_large(rank, p):
    # Every rank sends 16 MiB to both neighbours and receives from both at
    # once: only a batch that runs as one group completes.
    n = 4 << 20
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    s1, s2 = torch.full((n,), float(rank)), torch.full((n,), float(100 + rank))
    r1, r2 = torch.empty(n), torch.empty(n)
    ops = [dist.P2POp(dist.isend, s1, nxt), dist.P2POp(dist.isend, s2, prv),
           dist.P2POp(dist.irecv, r1, prv), dist.P2POp(dist.irecv, r2, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(r1, torch.full((n,), float(prv))) and torch.equal(r2, torch.full((n,), float(100 + nxt)))


def test_batch_p2p_large_3():
    run_ranks(3, _batch_p2p_large)


# ---- timeouts, abort, errors ----

def _group_timeout(rank, p):
    g = dist.new_group(timeout=timedelta(seconds=1))
    if rank == 0:
        t0 = time.monotonic()
        e = _err(lambda: dist.barrier(group=g))
        took = time.monotonic() - t0
        assert isinstance(e, dist.DistBackendError), repr(e)
        assert " Timed out " in str(e) and "1000ms" in str(e) and "timed out after 1 s" in str(e), str(e)
        assert 0.9 < took < 20, (took, str(e))
        _expect(lambda: dist.all_reduce(torch.ones(2), group=g), "aborted after an earlier failure", "Timed out")
        _store().set("rank0_done", "1")
    else:
        _store().wait(["rank0_done"])
    # the default group still works (its timeout is the default)
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(p)))


def _err(fn):
    try:
        fn()
    except Exception as e:  # noqa: B902
        return e
    return None


def test_group_timeout_2():
    run_ranks(2, _group_timeout, env={"LOOM_TIMEOUT": "120"})


def _barrier_timeout_arg(rank, p):
    g = dist.new_group(timeout=timedelta(seconds=300))
    if rank == 0:
        t0 = time.monotonic()
        _expect(lambda: dist.barrier(group=g, timeout=timedelta(milliseconds=300)), "Timed out waiting 300ms")
        assert time.monotonic() - t0 < 20
        _store().set("rank0_done", "1")
    else:
        _store().wait(["rank0_done"])


def test_barrier_timeout_arg_2():
    run_ranks(2, _barrier_timeout_arg, env={"LOOM_TIMEOUT": "120"})


def _abort_in_flight(rank, p):
    g = dist.new_group()
    if rank == 0:
        w = dist.all_reduce(torch.ones(4), group=g, async_op=True)  # rank 1 never joins it
        be = g._get_backend(torch.device("cpu"))
        t0 = time.monotonic()
        be.abort()
        e = _err(w.wait)
        assert e is not None and time.monotonic() - t0 < 20, e
        _expect(lambda: dist.all_reduce(torch.ones(2), group=g), "aborted", "abort()")
        _store().set("rank0_done", "1")
    else:
        _store().wait(["rank0_done"])


def test_abort_in_flight_2():
    run_ranks(2, _abort_in_flight, env={"LOOM_TIMEOUT": "120"})


def _destroyed(rank, p):
    g = dist.new_group()
    t = torch.ones(2)
    w = dist.all_reduce(t, group=g, async_op=True)
    dist.destroy_process_group(g)  # what was queued runs first
    assert w.is_completed() and torch.equal(t, torch.full((2,), float(p))), t
    be = _default_backend()
    _expect(lambda: be.recv_anysource([torch.ones(1)], 0), "recv without a source rank is not supported")


def _default_backend():
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))


def test_destroy_runs_queued_2():
    run_ranks(2, _destroyed)


# ---- groups ----

def _split(rank, p):
    # split_group: [0, 2] and [1, 3]; then new_subgroups of size 2.
    g = dist.split_group(split_ranks=[[0, 2], [1, 3]])
    assert g is not None and dist.get_world_size(g) == 2
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=g)
    assert t.item() == (2.0 if rank % 2 == 0 else 4.0), t
    assert dist.get_rank(g) == rank // 2
    # a split that leaves rank 3 out
    h = dist.split_group(split_ranks=[[0, 1, 2]])
    if rank == 3:
        assert h is None or h == dist.GroupMember.NON_GROUP_MEMBER, h
    else:
        t = torch.ones(1)
        dist.all_reduce(t, group=h)
        assert t.item() == 3.0, t
    sub, _ = dist.new_subgroups(group_size=2)
    t = torch.ones(1)
    dist.all_reduce(t, group=sub)
    assert t.item() == 2.0
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 4.0


def test_split_group_4():
    run_ranks(4, _split)


# ---- data kinds ----

def _sparse(rank, p):
    dense = torch.zeros(6, 4)
    dense[rank % 6, :] = rank + 1
    dense[5, 1] = 1.0
    sp = dense.to_sparse()
    dist.all_reduce(sp)
    want = sum(_dense_for(r) for r in range(p))
    assert sp.is_sparse and torch.equal(sp.to_dense(), want), (sp.to_dense(), want)
    empty = torch.zeros(3, 3).to_sparse()
    dist.all_reduce(empty)
    assert empty.is_sparse and torch.equal(empty.to_dense(), torch.zeros(3, 3))
    _expect(lambda: dist.all_reduce(torch.zeros(2, 2).to_sparse(), op=dist.ReduceOp.MAX), "ReduceOp.SUM only")


def _dense_for(r):
    d = torch.zeros(6, 4)
    d[r % 6, :] = r + 1
    d[5, 1] = 1.0
    return d


def test_sparse_all_reduce_3():
    run_ranks(3, _sparse)


def _bitwise(rank, p):
    bits = [0x0F0F, 0x3C3C, 0x5555, 0x7001]
    for dt in (torch.int8, torch.uint8, torch.int32, torch.int64):
        vals = [torch.tensor([b + r for r in range(3)], dtype=torch.int64).to(dt) for b in bits[:p]]
        for op, fold in ((dist.ReduceOp.BAND, lambda a, b: a & b), (dist.ReduceOp.BOR, lambda a, b: a | b),
                         (dist.ReduceOp.BXOR, lambda a, b: a ^ b)):
            t = vals[rank].clone()
            dist.all_reduce(t, op=op)
            want = vals[0]
            for v in vals[1:]:
                want = fold(want, v)
            assert torch.equal(t, want), (dt, op, t, want)
    b = torch.tensor([rank == 0, True, False, rank % 2 == 1])
    for op, want in ((dist.ReduceOp.BAND, [False, True, False, False]), (dist.ReduceOp.BOR, [True, True, False, True]),
                     (dist.ReduceOp.BXOR, [True, p % 2 == 1, False, (p // 2) % 2 == 1])):
        t = b.clone()
        dist.all_reduce(t, op=op)
        assert t.tolist() == want, (op, t, want)
    _expect(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR), "BXOR", "not supported", "Float")


def test_bitwise_all_reduce_3():
    run_ranks(3, _bitwise)


def _objects(rank, p):
    got = [None] * p
    dist.all_gather_object(got, {"rank": rank, "x": [rank] * rank})
    assert got == [{"rank": r, "x": [r] * r} for r in range(p)], got
    objs = [f"from {rank}", rank] if rank == 1 else [None, None]
    dist.broadcast_object_list(objs, src=1)
    assert objs == ["from 1", 1], objs
    out = [None]
    dist.scatter_object_list(out, [r * 10 for r in range(p)] if rank == 0 else None, src=0)
    assert out[0] == rank * 10


def test_object_collectives_3():
    run_ranks(3, _objects)


if __name__ == "__main__":
    main(globals())
