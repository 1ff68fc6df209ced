#!/usr/bin/python3
"""The Gloo side of perf/compare_host.sh: torch.distributed's gloo backend
on CPU float32 tensors, timed and sized as Loom's *_perf tools do. Size is
the largest buffer of the call (AllReduce's buffer, AllGather's output,
ReduceScatter's input), rounded down to whole floats per rank; sizes that
leave none are skipped.

    gloo_coll.py COLL NRANKS MIN MAX FACTOR WARMUP ITERS

starts NRANKS processes that meet through a file store in a fresh
temporary directory (so there is no port to pick or to collide on) and
prints, from rank 0, one line per size: "coll size time_us algbw busbw",
time being the slowest rank's mean over ITERS calls. all_reduce is in
place (torch has no other form); all_gather is the list form, torch 1.13's
gloo lacking all_gather_into_tensor. A collective gloo lacks prints
"coll unsupported: reason" and exits 3.
"""
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

UNSUPPORTED = 3


def call(coll, t, parts, out):
    if coll == "allreduce":
        dist.all_reduce(t)
    elif coll == "allgather":
        dist.all_gather(parts, t)
    else:
        dist.reduce_scatter(out, parts)


def buffers(coll, rank, count, n):
    """(t, parts, out) for one call on count floats in all, every rank's
    input holding rank + 1."""
    per = count // n
    if coll == "allreduce":
        return torch.full((count,), float(rank + 1)), None, None
    if coll == "allgather":
        return torch.full((per,), float(rank + 1)), [torch.zeros(per) for _ in range(n)], None
    return None, [torch.full((per,), float(rank + 1)) for _ in range(n)], torch.zeros(per)


def wrong(coll, rank, count, n):
    """One checked call outside the timing: a wrong baseline would make the
    ratios lie. all_reduce is in place, so it needs fresh inputs."""
    t, parts, out = buffers(coll, rank, count, n)
    call(coll, t, parts, out)
    total = float(n * (n + 1) // 2)
    if coll == "allreduce":
        return not bool(torch.all(t == total))
    if coll == "allgather":
        return any(not bool(torch.all(p == float(i + 1))) for i, p in enumerate(parts))
    return not bool(torch.all(out == total))


def rank_main(rank, coll, n, lo, hi, factor, warmup, iters, store):
    # One compute thread per rank, as Loom's and Open MPI's ranks have;
    # with more, oversubscribed ranks would fight over the two cores.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=n)
    busf = 2.0 * (n - 1) / n if coll == "allreduce" else (n - 1) / n
    size = lo
    while size <= hi:
        count = size // 4
        if coll != "allreduce":
            count -= count % n
        if count > 0:
            t, parts, out = buffers(coll, rank, count, n)
            try:
                for _ in range(max(warmup, 1)):
                    call(coll, t, parts, out)
            except RuntimeError as e:
                if rank == 0:
                    print("%s unsupported: %s" % (coll, str(e).splitlines()[0]), flush=True)
                # Every rank gets the same error at once, before any
                # traffic; exiting without teardown leaves no peer waiting.
                os._exit(UNSUPPORTED)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call(coll, t, parts, out)
            mean = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
            dist.all_reduce(mean, op=dist.ReduceOp.MAX)
            secs = mean.item()
            if wrong(coll, rank, count, n):
                print("gloo_coll: rank %d: wrong %s result at %d bytes" % (rank, coll, count * 4),
                      file=sys.stderr, flush=True)
                os._exit(1)
            algbw = count * 4 / secs / 1e9
            if rank == 0:
                print("%s %d %.2f %.3f %.3f" % (coll, count * 4, secs * 1e6, algbw, algbw * busf), flush=True)
        size *= factor
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 8 or sys.argv[1] not in ("allreduce", "allgather", "reducescatter"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    coll = sys.argv[1]
    n, lo, hi, factor, warmup, iters = map(int, sys.argv[2:])
    if n < 1 or lo < 1 or hi < lo or factor < 2 or warmup < 0 or iters < 1:
        print("gloo_coll.py: need NRANKS >= 1, 1 <= MIN <= MAX, FACTOR >= 2, WARMUP >= 0, ITERS >= 1",
              file=sys.stderr)
        sys.exit(2)
    # A SIGTERM from timeout(1) becomes an exit that runs the cleanup of the
    # temporary directory; the ranks share the process group and get it too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    with tempfile.TemporaryDirectory(prefix="loom-gloo-") as d:
        store = os.path.join(d, "store")
        try:
            mp.spawn(rank_main, args=(coll, n, lo, hi, factor, warmup, iters, store), nprocs=n)
        except mp.ProcessExitedException as e:
            sys.exit(UNSUPPORTED if e.exit_code == UNSUPPORTED else 1)
        except mp.ProcessRaisedException as e:
            print("gloo_coll.py: a rank failed:\n%s" % e, file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
