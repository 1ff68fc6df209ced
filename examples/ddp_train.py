#!/usr/bin/env python3
"""Trains a small MLP on synthetic data with DistributedDataParallel on N
processes, once with the gloo backend and once with loom (Loom's
torch.distributed backend, bindings/torch), from the same seed; checks that
the two runs' losses agree step by step and prints both backends' time per
step side by side. Both models train in the same processes, one step of
each in turn, so that the two timings see the same machine.

    PYTHONPATH=<build>/bindings/torch LOOM_NCCL_LIB=<build>/libnccl.so.2 \\
        python3 examples/ddp_train.py --ranks 4 --steps 20

Exit status: 0 when the losses agree (within --rtol/--atol) on every rank
and step, 1 when they differ, 2 when a rank failed. --min-speedup X also
fails (status 3) when loom is not X times faster per step than gloo.

Both backends run with the same torch.set_num_threads (--threads, default
1): with several processes per core, torch's intra-op threads would
otherwise compete with each other and with the backends' own threads, and
the figure would measure the scheduler. The same count goes to OpenBLAS
(OPENBLAS_NUM_THREADS, unless already set): Debian's torch calls the
system BLAS without telling it torch's thread count, so each process would
also start one OpenBLAS thread per CPU, and those spin while they wait.

SPDX-License-Identifier: Apache-2.0
"""

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback


def build_model(torch, hidden, layers, inp, out):
    mods = [torch.nn.Linear(inp, hidden), torch.nn.ReLU()]
    for _ in range(layers - 2):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    mods.append(torch.nn.Linear(hidden, out))
    return torch.nn.Sequential(*mods)


def rank_main(rank, args, store_path, q):
    """One rank: a DDP model per backend, from the same seed and on the same
    data, trained in turns, one step of each backend after the other (the
    order alternates), so that both backends meet the same machine: on a
    shared host the load moves during a run, and two runs one after the
    other would also measure that."""
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.set_num_threads(args.threads)
        backends = args.backends
        if "loom" in backends:
            import loom_torch  # noqa: F401  (registers "loom")
        # The default group only carries the models' start: each backend's
        # DDP has a group of its own.
        dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=args.ranks)
        runs = {}
        for bk in backends:
            group = dist.new_group(backend=bk)
            torch.manual_seed(args.seed)
            model = build_model(torch, args.hidden, args.layers, args.hidden, args.out)
            ddp = DDP(model, bucket_cap_mb=args.bucket_mb, process_group=group,
                      gradient_as_bucket_view=args.bucket_view)
            opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
            grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            runs[bk] = {"group": group, "ddp": ddp, "opt": opt,
                        "out": {"losses": [], "times": [], "comm": [], "phases": [], "grad_bytes": grad_bytes}}
        # Synthetic data: each rank its own shard of the same stream.
        gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
        w_true = torch.randn(args.hidden, args.out, generator=torch.Generator().manual_seed(args.seed))
        for step in range(args.warmup + args.steps):
            x = torch.randn(args.batch, args.hidden, generator=gen)
            y = torch.tanh(x @ w_true) + 0.01 * torch.randn(args.batch, args.out, generator=gen)
            for bk in (backends if step % 2 == 0 else backends[::-1]):
                run_ = runs[bk]
                ddp, opt, out = run_["ddp"], run_["opt"], run_["out"]
                dist.barrier(group=run_["group"])
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                t1 = time.perf_counter()
                loss.backward()  # DDP all-reduces the gradient buckets in here
                t2 = time.perf_counter()
                opt.step()
                t3 = time.perf_counter()
                out["losses"].append(loss.item())
                if step >= args.warmup:
                    out["times"].append(t3 - t0)
                    out["phases"].append((t1 - t0, t2 - t1, t3 - t2))
        if args.profile:
            # The same bytes as the gradients, all-reduced alone: how much
            # of a step is communication.
            for bk in backends:
                out = runs[bk]["out"]
                flat = torch.ones(out["grad_bytes"] // 4)
                for i in range(args.warmup + 3):
                    dist.barrier(group=runs[bk]["group"])
                    t0 = time.perf_counter()
                    dist.all_reduce(flat, group=runs[bk]["group"])
                    if i >= args.warmup:
                        out["comm"].append(time.perf_counter() - t0)
        dist.barrier()
        for bk in backends:
            dist.destroy_process_group(runs[bk]["group"])
        dist.destroy_process_group()
        q.put((rank, {bk: runs[bk]["out"] for bk in backends}))
    except BaseException:  # noqa: B902 - reported to the parent, whatever it is
        q.put((rank, traceback.format_exc()))


def run(args):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="ddp-")
    procs = [ctx.Process(target=rank_main, args=(r, args, os.path.join(tmp, "store"), q))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    res = {}
    try:
        for _ in range(args.ranks):
            r, v = q.get(timeout=args.timeout)
            res[r] = v
    except Exception:  # noqa: B902 - a queue timeout
        pass
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    bad = {r: v for r, v in res.items() if isinstance(v, str)}
    if bad or len(res) != args.ranks:
        for r, v in sorted(bad.items()):
            print(f"--- rank {r} failed:\n{v}", file=sys.stderr)
        if len(res) != args.ranks:
            print(f"--- {args.ranks - len(res)} rank(s) never answered", file=sys.stderr)
        sys.exit(2)
    # by backend, then rank
    return {bk: {r: res[r][bk] for r in res} for bk in args.backends}


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after the warmup ones)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers")
    ap.add_argument("--layers", type=int, default=5, help="Linear layers (5 x 1024 wide: 16 MiB of gradients)")
    ap.add_argument("--out", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every rank, both backends")
    ap.add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb")
    ap.add_argument("--bucket-view", action=argparse.BooleanOptionalAction, default=True,
                    help="DDP gradient_as_bucket_view (default on, both backends): gradients live in the "
                         "buckets, with no copy in and out")
    ap.add_argument("--backends", default="gloo,loom")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-6)
    ap.add_argument("--min-speedup", type=float, default=0.0)
    ap.add_argument("--profile", action="store_true", help="also time one all_reduce of the gradients' size")
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args()

    backends = args.backends = args.backends.split(",")
    if not all(backends) or len(set(backends)) != len(backends):
        ap.error("--backends: one or more distinct backend names, such as gloo,loom")
    # Read by OpenBLAS when torch loads it, in each rank (forked from here).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    results = run(args)
    first = results[backends[0]][0]
    print(f"DDP: {args.ranks} processes, MLP {args.layers} x {args.hidden} wide, "
          f"{first['grad_bytes'] / 2**20:.1f} MiB of gradients, batch {args.batch} per rank, "
          f"torch threads {args.threads} (OpenBLAS {os.environ['OPENBLAS_NUM_THREADS']}), "
          f"bucket view {'on' if args.bucket_view else 'off'}, {args.warmup} warmup + {args.steps} timed steps")

    status = 0
    if len(backends) == 2:
        a, b = backends
        print(f"{'step':>4} {'rank':>4} {a + ' loss':>14} {b + ' loss':>14} {'|diff|':>10}")
        worst = 0.0
        for r in range(args.ranks):
            la, lb = results[a][r]["losses"], results[b][r]["losses"]
            for s, (x, y) in enumerate(zip(la, lb)):
                d = abs(x - y)
                worst = max(worst, d)
                if r == 0 or d > args.atol + args.rtol * abs(x):
                    print(f"{s:>4} {r:>4} {x:>14.8f} {y:>14.8f} {d:>10.2e}")
                if d > args.atol + args.rtol * abs(x):
                    status = 1
        print(f"max |loss difference| over every rank and step: {worst:.3e} "
              f"({'within' if status == 0 else 'OUTSIDE'} rtol {args.rtol} atol {args.atol})")

    med = {}
    for bk in backends:
        # a step takes as long as its slowest rank
        per_step = [max(results[bk][r]["times"][i] for r in range(args.ranks)) for i in range(args.steps)]
        med[bk] = median(per_step)
        line = f"{bk:>6}: {med[bk] * 1e3:9.2f} ms per step (median of {args.steps}, slowest rank)"
        if args.profile:
            c = median([max(results[bk][r]["comm"][i] for r in range(args.ranks)) for i in range(3)])
            line += f"; one all_reduce of the gradients alone: {c * 1e3:.2f} ms"
            ph = [median([results[bk][0]["phases"][i][k] for i in range(args.steps)]) * 1e3 for k in range(3)]
            line += f"; rank 0 forward/backward+comm/optimizer: {ph[0]:.1f}/{ph[1]:.1f}/{ph[2]:.1f} ms"
        print(line)
    if "gloo" in med and "loom" in med:
        ratio = med["gloo"] / med["loom"]
        print(f"loom is {ratio:.2f}x as fast as gloo per step ({args.ranks} processes)")
        if args.min_speedup and ratio < args.min_speedup and status == 0:
            print(f"FAIL: below the required {args.min_speedup}x")
            status = 3
    if status == 1:
        print("FAIL: the losses differ between the backends")
    sys.exit(status)


if __name__ == "__main__":
    main()
