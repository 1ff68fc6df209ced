"""PyTorch's own "nccl" backend on CUDA tensors, served by Loom's
libnccl.so.2 in place of NVIDIA's: the GPU step of the PyTorch issue,
run by tests/gpu/run.sh on a machine with a GPU.

    LOOM_NCCL_LIB=<build>/libnccl.so.2 python3 gpu_nccl_backend.py [--ranks 2]

The script starts itself again with LD_PRELOAD naming that library (the
already-loaded library then serves the soname libnccl.so.2, also over a
wheel's RPATH to its own copy; docs/pytorch.md), and NCCL_DEBUG=VERSION so
that the library prints its banner. Each rank, a process on the same GPU
(Loom allows several ranks per device), then:
- checks that the nccl* calls resolve to LOOM_NCCL_LIB (NVIDIA's copy may
  be mapped too, loaded by path by the pip layout, and must serve nothing),
  and that the library exports Loom's own loomTransports;
- runs every collective torch.distributed has for the nccl backend
  (all_reduce with each op, all_gather, all_gather_into_tensor,
  reduce_scatter, reduce_scatter_tensor, broadcast, reduce, send/recv,
  all_to_all_single, gather, scatter, barrier) on float32, float16, bfloat16, int32 and
  int64 CUDA tensors, and compares each result with the value computed on
  the host.
The parent checks every rank's stderr for Loom's banner.

Exit status: 0 passed, 1 a check failed, 77 skipped (no torch, torch
without CUDA, or no CUDA device): the skip says which.

SPDX-License-Identifier: Apache-2.0
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import traceback

SKIP = 77


def skip(why):
    print(f"skip: {why}")
    sys.exit(SKIP)


def mapped_libnccl():
    """The files named libnccl.so* mapped into this process."""
    seen = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and "libnccl.so" in os.path.basename(parts[5]):
                seen.add(os.path.realpath(parts[5]))
    return seen


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def defining_file(name):
    """The file that defines the symbol `name` as this process resolves it
    (the global scope, where LD_PRELOAD comes first)."""
    addr = ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value
    info = _DlInfo()
    libdl = ctypes.CDLL(None)
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if not libdl.dladdr(addr, ctypes.byref(info)) or not info.dli_fname:
        raise AssertionError(f"dladdr cannot place {name}")
    return os.path.realpath(info.dli_fname.decode())


def check_library(want):
    """Loom serves the nccl* calls. The pip layout may also load NVIDIA's
    libnccl.so.2 by path (torch's RPATH, its preloading of CUDA libraries):
    mapped, but the preloaded library comes first in the global scope, so
    what matters is where the symbols resolve, not what is mapped."""
    libs = mapped_libnccl()
    want = os.path.realpath(want)
    if want not in libs:
        raise AssertionError(f"libnccl.so mapped here: {sorted(libs)}, none is {want}")
    for name in ("ncclCommInitRank", "ncclAllReduce", "ncclGetVersion"):
        where = defining_file(name)
        if where != want:
            raise AssertionError(f"{name} resolves to {where}, not Loom's {want}")
    try:
        ctypes.CDLL(None).loomTransports
    except AttributeError:
        raise AssertionError("the libnccl.so.2 in this process has no loomTransports: it is not Loom")


def expect_reduce(torch, op, vals):
    import torch.distributed as dist
    acc = vals[0].clone()
    for v in vals[1:]:
        if op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG:
            acc = acc + v
        elif op == dist.ReduceOp.PRODUCT:
            acc = acc * v
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, v)
        else:
            acc = torch.minimum(acc, v)
    if op == dist.ReduceOp.AVG:
        acc = acc / len(vals)
    return acc


def rank_main(rank, n, store_dir, count):
    import torch
    import torch.distributed as dist

    check_library(os.environ["LOOM_NCCL_LIB"])
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", init_method="file://" + os.path.join(store_dir, "store"), rank=rank,
                            world_size=n)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.AVG]
    failures = []

    def data(r, dt, m=count):
        # Small integers: exact in every dtype, sums and products included.
        base = torch.arange(m, dtype=torch.int64)
        return ((base * (r + 3) + r) % 3 + 1).to(dt)

    def check(name, got, want):
        got = got.cpu()
        if got.dtype in (torch.float16, torch.bfloat16):
            ok = torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
        elif got.dtype.is_floating_point:  # AVG over 3 ranks may round either way
            ok = torch.allclose(got.double(), want.double(), rtol=1e-6, atol=0)
        else:
            ok = torch.equal(got, want.to(got.dtype))
        if not ok:
            bad = (got.double() - want.double()).abs().argmax().item()
            failures.append(f"rank {rank}: {name}: element {bad} is {got.view(-1)[bad].item()}, "
                            f"expected {want.view(-1)[bad].item()}")

    for dt in dtypes:
        ins = [data(r, dt) for r in range(n)]
        for op in ops:
            if op == dist.ReduceOp.AVG and not dt.is_floating_point:
                continue  # NCCL's avg is for floating types in torch
            t = ins[rank].to(dev)
            dist.all_reduce(t, op=op)
            check(f"all_reduce {op} {dt}", t, expect_reduce(torch, op, [x.double() for x in ins]))
        outs = [torch.empty(count, dtype=dt, device=dev) for _ in range(n)]
        dist.all_gather(outs, ins[rank].to(dev))
        for r in range(n):
            check(f"all_gather {dt} block {r}", outs[r], ins[r])
        flat = torch.empty(n * count, dtype=dt, device=dev)
        dist.all_gather_into_tensor(flat, ins[rank].to(dev))
        check(f"all_gather_into_tensor {dt}", flat, torch.cat(ins))
        big = [data(r, dt, n * count) for r in range(n)]
        out = torch.empty(count, dtype=dt, device=dev)
        dist.reduce_scatter_tensor(out, big[rank].to(dev))
        total = expect_reduce(torch, dist.ReduceOp.SUM, [b.double() for b in big])
        check(f"reduce_scatter_tensor {dt}", out, total[rank * count:(rank + 1) * count])
        out2 = torch.empty(count, dtype=dt, device=dev)
        dist.reduce_scatter(out2, [c.to(dev) for c in big[rank].chunk(n)])
        check(f"reduce_scatter {dt}", out2, total[rank * count:(rank + 1) * count])
        root = n - 1
        t = ins[rank].to(dev)
        dist.broadcast(t, src=root)
        check(f"broadcast {dt}", t, ins[root])
        t = ins[rank].to(dev)
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        if rank == root:
            check(f"reduce {dt}", t, expect_reduce(torch, dist.ReduceOp.SUM, [x.double() for x in ins]))
        # send/recv around the ring, in one batch so neither side waits.
        nxt, prv = (rank + 1) % n, (rank + n - 1) % n
        got = torch.empty(count, dtype=dt, device=dev)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, ins[rank].to(dev), nxt),
                                       dist.P2POp(dist.irecv, got, prv)])
        for q in reqs:
            q.wait()
        check(f"send/recv {dt}", got, ins[prv])
        # all_to_all_single: block j of rank r's input goes to rank j.
        a2a_in = torch.cat([data(rank * n + j, dt) for j in range(n)]).to(dev)
        a2a_out = torch.empty(n * count, dtype=dt, device=dev)
        dist.all_to_all_single(a2a_out, a2a_in)
        check(f"all_to_all_single {dt}", a2a_out, torch.cat([data(j * n + rank, dt) for j in range(n)]))
        # gather to the root and scatter from it (ncclGather/ncclScatter,
        # or grouped send/recv, whichever this torch calls).
        gl = [torch.empty(count, dtype=dt, device=dev) for _ in range(n)] if rank == root else None
        dist.gather(ins[rank].to(dev), gather_list=gl, dst=root)
        if rank == root:
            for r in range(n):
                check(f"gather {dt} block {r}", gl[r], ins[r])
        got = torch.empty(count, dtype=dt, device=dev)
        sl = [data(100 + r, dt).to(dev) for r in range(n)] if rank == root else None
        dist.scatter(got, scatter_list=sl, src=root)
        check(f"scatter {dt}", got, data(100 + rank, dt))
    dist.barrier()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    if failures:
        raise AssertionError("\n".join(failures[:20]))
    print(f"rank {rank}: every collective right on {len(dtypes)} dtypes, count {count}")


def child(args):
    try:
        rank_main(args.rank, args.ranks, args.store, args.count)
    except Exception:  # noqa: B902 - reported through the exit status
        traceback.print_exc()
        sys.exit(1)


def parent(args):
    lib = os.environ.get("LOOM_NCCL_LIB")
    if not lib or not os.path.exists(lib):
        print("LOOM_NCCL_LIB must name Loom's libnccl.so.2", file=sys.stderr)
        return 1
    try:
        import torch
    except ImportError as e:
        skip(f"no PyTorch here ({e})")
    if not torch.cuda.is_available():
        skip(f"PyTorch {torch.__version__} here has no CUDA or sees no CUDA device")
    if not torch.distributed.is_nccl_available():
        skip(f"PyTorch {torch.__version__} here was built without its nccl backend")
    with tempfile.TemporaryDirectory(prefix="loom-torch-gpu-") as tmp:
        env = dict(os.environ, LD_PRELOAD=lib, NCCL_DEBUG="VERSION")
        procs = [subprocess.Popen([sys.executable, __file__, "--child", "--rank", str(r), "--ranks", str(args.ranks),
                                   "--store", tmp, "--count", str(args.count)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(args.ranks)]
        status = 0
        for r, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                out, _ = p.communicate()
                print(f"rank {r}: still running after {args.timeout} s: a hang")
                status = 1
            print(f"--- rank {r} (exit {p.returncode})\n{out}")
            if p.returncode != 0:
                status = 1
            elif "Loom " not in out:
                print(f"rank {r}: no Loom banner in its output with NCCL_DEBUG=VERSION: was NVIDIA's NCCL used?")
                status = 1
    print("PASS" if status == 0 else "FAIL")
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--count", type=int, default=100003, help="elements per call (odd on purpose)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--store", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
