"""Tests of the loom torch.distributed backend (bindings/torch). Each
`test_*` function is one CTest test torch_NAME (bindings/torch/CMakeLists.txt
reads their names from this file), run as `python3 test_torch.py NAME` in a
process of its own; ranks are processes forked from it, each with a time
limit, meeting through a FileStore in a fresh directory (or a TCPStore on a
port the kernel chose). PYTHONPATH names the built package
(<build>/bindings/torch) and LOOM_NCCL_LIB the library.

SPDX-License-Identifier: Apache-2.0
"""

import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist

import loom_torch  # noqa: F401  (registers "loom")

RANK_TIMEOUT_S = 90
INT_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = INT_DTYPES + FLOAT_DTYPES + [torch.bool]
N = 1001


def _rank_main(fn, nranks, rank, path, q, env):
    try:
        os.environ.update(env)
        torch.set_num_threads(1)
        if path is None:  # TCPStore on a port the kernel chose, told through q
            if rank == 0:
                store = dist.TCPStore("127.0.0.1", 0, nranks, True, wait_for_workers=False)
                for _ in range(nranks - 1):
                    q.put(("port", store.port))
            else:
                store = dist.TCPStore("127.0.0.1", int(env["_PORT"]), nranks, False)
            dist.init_process_group("loom", store=store, rank=rank, world_size=nranks)
        else:
            dist.init_process_group("loom", init_method="file://" + path, rank=rank, world_size=nranks)
        fn(rank, nranks)
        dist.destroy_process_group()
        q.put((rank, None))
    except BaseException:  # noqa: B902 - reported to the parent, whatever it is
        q.put((rank, traceback.format_exc()))


def _tcp_rank_main(fn, nranks, rank, q, portq, env):
    if rank != 0:
        env = dict(env, _PORT=str(portq.get(timeout=RANK_TIMEOUT_S)))
        _rank_main(fn, nranks, rank, None, q, env)
    else:
        _rank_main(fn, nranks, rank, None, _Tee(q, portq), env)


class _Tee:
    """Sends ("port", p) to the port queue and everything else to the result queue."""

    def __init__(self, q, portq):
        self.q, self.portq = q, portq

    def put(self, item):
        (self.portq if item[0] == "port" else self.q).put(item[1] if item[0] == "port" else item)


def run_ranks(nranks, fn, env=None, tcp=False):
    """Runs fn(rank, nranks) on nranks processes inside a loom process group;
    raises if any failed or hung."""
    env = dict(env or {})
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="loom-torch-")
    if tcp:
        portq = ctx.Queue()
        procs = [ctx.Process(target=_tcp_rank_main, args=(fn, nranks, r, q, portq, env)) for r in range(nranks)]
    else:
        path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank_main, args=(fn, nranks, r, path, q, env)) for r in range(nranks)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(nranks):
            rank, err = q.get(timeout=RANK_TIMEOUT_S)
            results[rank] = err
    except Exception:  # noqa: B902 - a queue timeout: some rank hung
        pass
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    failed = {r: e for r, e in results.items() if e}
    if failed or len(results) != nranks:
        raise AssertionError("ranks failed: " + "".join(f"\n--- rank {r}:\n{e}" for r, e in sorted(failed.items()))
                             + ("" if len(results) == nranks else f"\n{nranks - len(results)} rank(s) never answered"))


def _values(dtype, n, rank, mod=5):
    # Small integers, so every reduction is exact in every type.
    v = (torch.arange(n) % mod) + rank + 1
    if dtype == torch.bool:
        return ((torch.arange(n) + rank) % 3) == 0
    return v.to(dtype)


def _check(got, want, what):
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if got.dtype in (torch.float16, torch.bfloat16):
        ok = torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-2)
    else:
        ok = torch.equal(got, want)
    assert ok, f"{what}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}"


def _reference(dtype, n, p, op, mod=5):
    vals = [_values(dtype, n, r, mod) for r in range(p)]
    if dtype == torch.bool:
        stack = torch.stack(vals)
        if op in ("sum", "max"):
            return stack.any(0)
        return stack.all(0)
    stack = torch.stack([v.double() for v in vals])
    if op == "sum":
        out = stack.sum(0)
    elif op == "product":
        out = stack.prod(0)
    elif op == "min":
        out = stack.min(0).values
    elif op == "max":
        out = stack.max(0).values
    elif op == "avg":
        out = stack.mean(0)
    return out.to(dtype)


OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def _ops_for(dtype):
    return ["sum", "product", "min", "max"] + (["avg"] if dtype in FLOAT_DTYPES else [])


# ---- every op x dtype x 2/3/4 ranks ----

def _all_reduce(rank, p):
    for dt in DTYPES:
        for op in _ops_for(dt):
            mod = 2 if op == "product" else 5
            t = _values(dt, N, rank, mod)
            dist.all_reduce(t, op=OPS[op])
            _check(t, _reference(dt, N, p, op, mod), f"all_reduce {dt} {op}")
    e = torch.empty(0)
    dist.all_reduce(e)  # zero elements
    # async: the work object, its future and the result
    t = _values(torch.float32, N, rank)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait() is True and w.is_completed() and w.is_success()
    _check(w.get_future().value()[0], _reference(torch.float32, N, p, "sum"), "all_reduce future")


def _all_gather(rank, p):
    for dt in DTYPES:
        x = _values(dt, N, rank)
        outs = [torch.empty_like(x) for _ in range(p)]
        dist.all_gather(outs, x)
        for r in range(p):
            _check(outs[r], _values(dt, N, r), f"all_gather {dt} from {r}")
        big = torch.empty(p * N, dtype=dt)
        dist.all_gather_into_tensor(big, x)
        _check(big, torch.cat([_values(dt, N, r) for r in range(p)]), f"all_gather_into_tensor {dt}")
        big2 = torch.empty(p, N, dtype=dt)  # a 2-D output holding p rows
        dist.all_gather_into_tensor(big2, x)
        _check(big2, torch.stack([_values(dt, N, r) for r in range(p)]), f"all_gather_into_tensor 2-D {dt}")


def _all_gather_coalesced(rank, p):
    # c10d's contract: outs[r][i] receives rank r's input i. With as many
    # inputs as ranks, a list per input instead would pass its size checks
    # and come out transposed: each input here differs by rank and index.
    for n_in in (1, p, p + 1):
        ins = [_values(torch.float32, N + i, rank * 10 + i) for i in range(n_in)]
        outs = [[torch.empty(N + i) for i in range(n_in)] for _ in range(p)]
        dist.all_gather_coalesced(outs, ins)
        for r in range(p):
            for i in range(n_in):
                _check(outs[r][i], _values(torch.float32, N + i, r * 10 + i),
                       f"all_gather_coalesced with {n_in} inputs: rank {r}'s input {i}")


def _reduce_scatter(rank, p):
    for dt in DTYPES:
        for op in ("sum", "max", "min"):
            # rank r's chunk c is _values(dt, N, r + c)
            ins = [_values(dt, N, rank + c) for c in range(p)]
            out = torch.empty(N, dtype=dt)
            dist.reduce_scatter(out, ins, op=OPS[op])
            want_vals = [_values(dt, N, r + rank) for r in range(p)]
            _check(out, _fold(want_vals, op, dt), f"reduce_scatter {dt} {op}")
            big = torch.cat(ins)
            out2 = torch.empty(N, dtype=dt)
            dist.reduce_scatter_tensor(out2, big, op=OPS[op])
            _check(out2, _fold(want_vals, op, dt), f"reduce_scatter_tensor {dt} {op}")


def _fold(vals, op, dt):
    if dt == torch.bool:
        s = torch.stack(vals)
        return s.any(0) if op in ("sum", "max") else s.all(0)
    s = torch.stack([v.double() for v in vals])
    return {"sum": s.sum(0), "max": s.max(0).values, "min": s.min(0).values}[op].to(dt)


def _broadcast(rank, p):
    for dt in DTYPES:
        for root in range(p):
            t = _values(dt, N, rank) if rank == root else torch.zeros(N, dtype=dt)
            dist.broadcast(t, src=root)
            _check(t, _values(dt, N, root), f"broadcast {dt} root {root}")


def _reduce(rank, p):
    for dt in DTYPES:
        for root in range(p):
            for op in ("sum", "max"):
                t = _values(dt, N, rank)
                dist.reduce(t, dst=root, op=OPS[op])
                if rank == root:
                    _check(t, _reference(dt, N, p, op), f"reduce {dt} {op} root {root}")


def _send_recv(rank, p):
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    for dt in DTYPES:
        x = _values(dt, N, rank)
        y = torch.empty_like(x)
        # a ring: even ranks send first, odd ones receive first
        if rank % 2 == 0:
            dist.send(x, nxt)
            dist.recv(y, prv)
        else:
            dist.recv(y, prv)
            dist.send(x, nxt)
        _check(y, _values(dt, N, prv), f"send/recv {dt}")
    # batch_isend_irecv: every rank sends and receives at once (one group)
    x = _values(torch.float32, 1 << 20, rank)
    y = torch.empty_like(x)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, y, prv)])
    for r in reqs:
        r.wait()
    _check(y, _values(torch.float32, 1 << 20, prv), "batch_isend_irecv")


def _all_to_all(rank, p):
    for dt in DTYPES:
        # equal splits: 3 rows of 7 per rank
        x = torch.stack([_values(dt, 7, rank * 10 + c) for c in range(3 * p)])
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x)
        want = torch.cat([torch.stack([_values(dt, 7, s * 10 + rank * 3 + k) for k in range(3)]) for s in range(p)])
        _check(y, want, f"all_to_all_single equal {dt}")
        # unequal splits: rank s sends (s + d) % 3 rows (0 included) to rank d
        ins = [(rank + d) % 3 for d in range(p)]
        outs = [(s + rank) % 3 for s in range(p)]
        x = torch.cat([torch.stack([_values(dt, 5, rank * 100 + d * 10 + k) for k in range(ins[d])])
                       if ins[d] else torch.empty(0, 5, dtype=dt) for d in range(p)])
        y = torch.empty(sum(outs), 5, dtype=dt)
        dist.all_to_all_single(y, x, output_split_sizes=outs, input_split_sizes=ins)
        want = torch.cat([torch.stack([_values(dt, 5, s * 100 + rank * 10 + k) for k in range(outs[s])])
                          if outs[s] else torch.empty(0, 5, dtype=dt) for s in range(p)])
        _check(y, want, f"all_to_all_single unequal {dt}")
    # the list form
    ins = [_values(torch.int64, 4 + d, rank * 10 + d) for d in range(p)]
    outs = [torch.empty(4 + rank, dtype=torch.int64) for _ in range(p)]
    dist.all_to_all(outs, ins)
    for s in range(p):
        _check(outs[s], _values(torch.int64, 4 + rank, s * 10 + rank), "all_to_all list")


def _barrier(rank, p):
    import time
    for _ in range(3):
        dist.barrier()
    # the last rank arrives late; nobody may leave before it comes
    path = os.environ["_BARRIER_FILE"]
    if rank == p - 1:
        time.sleep(0.3)
        open(path, "w").close()
    dist.barrier()
    assert os.path.exists(path), "left the barrier before the last rank came"


def _gather_scatter(rank, p):
    for dt in (torch.float32, torch.int64, torch.bool):
        x = _values(dt, N, rank)
        gl = [torch.empty_like(x) for _ in range(p)] if rank == 1 else None
        dist.gather(x, gl, dst=1)
        if rank == 1:
            for r in range(p):
                _check(gl[r], _values(dt, N, r), f"gather {dt}")
        out = torch.empty(N, dtype=dt)
        sl = [_values(dt, N, 10 + r) for r in range(p)] if rank == 0 else None
        dist.scatter(out, sl, src=0)
        _check(out, _values(dt, N, 10 + rank), f"scatter {dt}")


def _subgroup(rank, p):
    even = dist.new_group([0, 2])
    odd = dist.new_group([1, 3])
    g = even if rank % 2 == 0 else odd
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=g)
    assert t.item() == (2.0 if rank % 2 == 0 else 4.0), t
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    assert t.item() == 6.0, t
    assert dist.get_backend(g) == "loom"


def test_all_reduce_2(): run_ranks(2, _all_reduce)  # noqa: E704
def test_all_reduce_3(): run_ranks(3, _all_reduce)  # noqa: E704
def test_all_reduce_4(): run_ranks(4, _all_reduce)  # noqa: E704
def test_all_gather_2(): run_ranks(2, _all_gather)  # noqa: E704
def test_all_gather_3(): run_ranks(3, _all_gather)  # noqa: E704
def test_all_gather_4(): run_ranks(4, _all_gather)  # noqa: E704
def test_all_gather_coalesced_2(): run_ranks(2, _all_gather_coalesced)  # noqa: E704
def test_all_gather_coalesced_3(): run_ranks(3, _all_gather_coalesced)  # noqa: E704
def test_reduce_scatter_2(): run_ranks(2, _reduce_scatter)  # noqa: E704
def test_reduce_scatter_3(): run_ranks(3, _reduce_scatter)  # noqa: E704
def test_reduce_scatter_4(): run_ranks(4, _reduce_scatter)  # noqa: E704
def test_broadcast_2(): run_ranks(2, _broadcast)  # noqa: E704
def test_broadcast_3(): run_ranks(3, _broadcast)  # noqa: E704
def test_broadcast_4(): run_ranks(4, _broadcast)  # noqa: E704
def test_reduce_2(): run_ranks(2, _reduce)  # noqa: E704
def test_reduce_3(): run_ranks(3, _reduce)  # noqa: E704
def test_reduce_4(): run_ranks(4, _reduce)  # noqa: E704
def test_send_recv_2(): run_ranks(2, _send_recv)  # noqa: E704
def test_send_recv_3(): run_ranks(3, _send_recv)  # noqa: E704
def test_send_recv_4(): run_ranks(4, _send_recv)  # noqa: E704
def test_all_to_all_2(): run_ranks(2, _all_to_all)  # noqa: E704
def test_all_to_all_3(): run_ranks(3, _all_to_all)  # noqa: E704
def test_all_to_all_4(): run_ranks(4, _all_to_all)  # noqa: E704
def test_gather_scatter_3(): run_ranks(3, _gather_scatter)  # noqa: E704
def test_subgroup_4(): run_ranks(4, _subgroup)  # noqa: E704


def test_barrier_3():
    d = tempfile.mkdtemp()
    try:
        run_ranks(3, _barrier, env={"_BARRIER_FILE": os.path.join(d, "late")})
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_tcp_store_3():
    run_ranks(3, _all_gather, tcp=True)


# ---- errors ----

def _expect(fn, *words):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"{w!r} not in the error: {msg}"
        return msg
    raise AssertionError(f"no error; expected one saying {words}")


def _mismatched_shapes(rank, p):
    t = torch.ones(1000 + 10 * rank)
    msg = _expect(lambda: dist.all_reduce(t), "loom backend: ncclAllReduce failed", "invalid usage",
                  "count 1000", "count 1010")
    assert "Exception raised from" not in msg, msg  # Loom's sentence, not a C++ backtrace
    # the group is now unusable, and says why
    _expect(lambda: dist.all_reduce(torch.ones(4)), "aborted after an earlier failure", "count 1010")


def test_error_mismatched_shapes_2():
    run_ranks(2, _mismatched_shapes)


def test_error_mismatched_shapes_checked_3():
    run_ranks(3, _mismatched_shapes, env={"LOOM_CHECK_CALLS": "1"})


def _mismatched_dtypes(rank, p):
    t = torch.ones(64, dtype=torch.float32 if rank == 0 else torch.int32)
    _expect(lambda: dist.all_reduce(t), "loom backend: ncclAllReduce failed", "int")


def test_error_mismatched_dtypes_2():
    run_ranks(2, _mismatched_dtypes)


def _bad_arguments(rank, p):
    x = torch.ones(8)
    # argument errors raise at the call and leave the group usable
    _expect(lambda: dist.all_reduce(torch.ones(8, dtype=torch.int16)), "loom backend", "Short", "no")
    c = torch.full((4,), 1 + 2j, dtype=torch.complex64)  # torch sends complex as float pairs
    dist.all_reduce(c)
    assert torch.equal(c, torch.full((4,), p * (1 + 2j), dtype=torch.complex64)), c
    _expect(lambda: dist.all_reduce(torch.ones(8, 8).t()), "not contiguous")
    _expect(lambda: dist.all_reduce(x, op=dist.ReduceOp.BXOR), "BXOR", "not supported")
    _expect(lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG), "AVG", "bool")
    outs = [torch.empty(8, dtype=torch.float64) for _ in range(p)]
    pg = dist.distributed_c10d._get_default_group()  # torch's python checks this one itself
    _expect(lambda: pg.allgather([outs], [x]), "same dtype", "Double", "Float")
    outs = [torch.empty(9) for _ in range(p)]
    _expect(lambda: dist.all_gather(outs, x), "same shape")
    _expect(lambda: dist.all_gather([torch.empty(8)], x), "output list has 1 tensors")
    _expect(lambda: dist.all_gather_into_tensor(torch.empty(8 * p + 1), x), "elements but must have")
    _expect(lambda: dist.all_gather_into_tensor(torch.empty(8 * p, dtype=torch.int64), x), "same dtype")
    _expect(lambda: dist.reduce_scatter_tensor(torch.empty(8), torch.empty(8 * p - 1)), "elements but must have")
    _expect(lambda: dist.all_to_all_single(torch.empty(4 * p), torch.empty(4 * p), [1] * p, [4] * p),
            "split sizes add up to")
    _expect(lambda: dist.all_to_all_single(torch.empty(2 * p + 1), torch.empty(2 * p + 1)), "split equally")
    # a CUDA tensor where torch has CUDA (meta ones: _cuda_direct)
    for t in _non_cpu_tensors()[:-1]:
        _expect(lambda: dist.all_reduce(t), "CPU tensors only", str(t.device))
        _expect(lambda: dist.broadcast(t, src=0), "CPU tensors only", str(t.device))
        _expect(lambda: dist.all_gather_into_tensor(torch.empty(8 * p), t), "CPU tensors only")
    # still usable
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((8,), float(p)))


def test_error_bad_arguments_2():
    run_ranks(2, _bad_arguments)


def _non_cpu_tensors():
    """A CUDA tensor where torch has CUDA; everywhere a meta tensor made in
    inference mode (no autograd key). torch 2.x's dispatcher answers for
    meta tensors itself, so those are handed to the backend directly."""
    out = []
    if torch.cuda.is_available():
        out.append(torch.ones(8, device="cuda"))
    with torch.inference_mode():
        out.append(torch.ones(8, device="meta"))
    return out


def _backend():
    """The default group's ProcessGroupLoom (torch 2.x wraps it in a ProcessGroup)."""
    pg = dist.distributed_c10d._get_default_group()
    be = pg._get_backend(torch.device("cpu"))
    assert isinstance(be, loom_torch.ProcessGroupLoom), type(be)
    assert be.name() == "loom", be.name()
    return be


def _cuda_direct(rank, p):
    # The backend's own check, called without torch's dispatcher.
    be = _backend()
    for t in _non_cpu_tensors():
        _expect(lambda: be.send([t], (rank + 1) % p, 0), "CPU tensors only", str(t.device))
        _expect(lambda: be.recv([t], (rank + 1) % p, 0), "CPU tensors only", str(t.device))
        _expect(lambda: be.allreduce([t]), "CPU tensors only", str(t.device))
        _expect(lambda: be.broadcast([t]), "CPU tensors only", str(t.device))
    _expect(lambda: be.send([torch.ones(2)], rank, 0), "its own rank")
    be.barrier().wait()


def test_error_cuda_tensor_2():
    run_ranks(2, _cuda_direct)


def main(tests=None):
    """Runs the test named on the command line; `tests` is the calling
    file's globals() (test_torch_async.py shares this), else this file's."""
    tests = tests if tests is not None else globals()
    if len(sys.argv) != 2 or not callable(tests.get("test_" + sys.argv[1])):
        names = sorted(k[5:] for k in tests if k.startswith("test_"))
        sys.exit(f"usage: {sys.argv[0]} NAME, one of: {' '.join(names)}")
    tests["test_" + sys.argv[1]]()
    print("ok", sys.argv[1])


if __name__ == "__main__":
    main()
