"""What examples/ddp_train.py and examples/fsdp_train.py share: starting
the ranks (forked here with --ranks N, or by torchrun), one wrapped model
per backend trained from the same seed on the same data with one step of
each backend in turn, the checks on the losses, the step times, and the
profiler's share of the step spent in collectives.

Two ways to run:
- `--ranks N` (no RANK/WORLD_SIZE in the environment): this process forks
  N ranks, which meet through a FileStore in a temporary directory.
- torchrun (RANK and WORLD_SIZE set): this process is one rank and meets
  the others through env:// (MASTER_ADDR/MASTER_PORT, set by torchrun).

With two backends (--backends gloo,loom, the default) the default group is
gloo's and each backend's model gets a group of its own; the check is that
the backends' losses agree step by step. With one backend (--backend loom)
the default group is that backend's, as in a user's script, and the check
is against a plain model trained in each rank on every rank's batch at once
(--reference): the loss a data-parallel step computes on a rank's shard is
the reference's loss on the same shard, since both average the gradients.

SPDX-License-Identifier: Apache-2.0
"""

import argparse
import math
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def add_common_args(ap, steps=10, warmup=2):
    ap.add_argument("--ranks", type=int, default=2, help="processes to fork (ignored under torchrun)")
    ap.add_argument("--steps", type=int, default=steps, help="timed steps (after the warmup ones)")
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every rank, both backends")
    ap.add_argument("--backends", "--backend", dest="backends", default="gloo,loom",
                    help="one backend (e.g. loom) or two to compare (gloo,loom, the default)")
    ap.add_argument("--reference", action=argparse.BooleanOptionalAction, default=None,
                    help="check the losses against a plain model trained on every rank's batch "
                         "(default: on with one backend)")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-6)
    ap.add_argument("--min-speedup", type=float, default=0.0)
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps, profile --profile-steps more per backend (torch.profiler) and "
                         "print the share of the step with an AllReduce/AllGather/ReduceScatter in flight")
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=240)


def parse(ap):
    args = ap.parse_args()
    backends = args.backends = args.backends.split(",")
    if not all(backends) or len(set(backends)) != len(backends):
        ap.error("--backends: one or more distinct backend names, such as gloo,loom")
    if args.reference is None:
        args.reference = len(backends) == 1
    args.torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.torchrun:
        args.ranks = int(os.environ["WORLD_SIZE"])
    # Read by OpenBLAS when torch loads it, in each rank.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    return args


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def _union_us(intervals, lo, hi):
    """Microseconds of [lo, hi] covered by at least one interval: two buckets
    in flight at once count once."""
    total, end = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= end or b <= a:
            continue
        total += b - max(a, end)
        end = b
    return total


def comm_shares(prof, backend):
    """Per profiled step (record_function "step:<backend>"), the share of the
    step during which a collective of this backend was in flight: its Work's
    profiler event ("loom:all_reduce", "gloo:all_gather", ...) runs from the
    call that queued it until the backend's thread finished it. Returns a
    list of {kind: share} with the kind "any" for all of them together."""
    steps, colls = [], []
    for e in prof.events():
        if e.name == "step:" + backend:
            steps.append((e.time_range.start, e.time_range.end))
        elif e.name.startswith(backend + ":"):
            colls.append((e.name[len(backend) + 1:], e.time_range.start, e.time_range.end))
    out = []
    for lo, hi in sorted(steps):
        d = {"any": _union_us([(a, b) for n, a, b in colls if n.startswith(COLLECTIVE_KINDS)], lo, hi) / (hi - lo)}
        for k in COLLECTIVE_KINDS:
            d[k] = _union_us([(a, b) for n, a, b in colls if n.startswith(k)], lo, hi) / (hi - lo)
        out.append(d)
    return out


def train_rank(rank, world, init_method, args, spec):
    """One rank. spec: make_model(torch), wrap(model, group) (group None for
    the default one), make_opt(params), batch(step, rank) -> (x, y),
    loss(out, y). Returns {backend: {"losses", "times", "phases", "shares",
    "ref_losses"}}."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    backends = args.backends
    if "loom" in backends:
        import loom_torch  # noqa: F401  (registers "loom")
    single = len(backends) == 1
    dist.init_process_group(backends[0] if single else "gloo", init_method=init_method,
                            rank=rank, world_size=world)
    runs = {}
    for bk in backends:
        group = None if single else dist.new_group(backend=bk)
        torch.manual_seed(args.seed)
        plain = spec.make_model(torch)
        params = sum(p.numel() for p in plain.parameters())
        model = spec.wrap(plain, group)
        runs[bk] = {"group": group, "model": model, "opt": spec.make_opt(model.parameters()),
                    "out": {"losses": [], "times": [], "phases": [], "shares": [], "ref_losses": [],
                            "params": params}}

    def step(bk, n, mark=None):
        r = runs[bk]
        model, opt, out = r["model"], r["opt"], r["out"]
        x, y = spec.batch(n, rank)
        dist.barrier(group=r["group"])
        if mark:
            mark.__enter__()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = spec.loss(model(x), y)
        t1 = time.perf_counter()
        loss.backward()  # DDP all-reduces, FSDP reduce-scatters the gradients in here
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if mark:
            mark.__exit__(None, None, None)
        out["losses"].append(loss.item())
        return t0, t1, t2, t3

    for n in range(args.warmup + args.steps):
        for bk in (backends if n % 2 == 0 else backends[::-1]):
            t0, t1, t2, t3 = step(bk, n)
            if n >= args.warmup:
                runs[bk]["out"]["times"].append(t3 - t0)
                runs[bk]["out"]["phases"].append((t1 - t0, t2 - t1, t3 - t2))
    if args.profile:
        # Separate steps: the profiler's own cost stays out of the timings.
        from torch.profiler import ProfilerActivity, profile, record_function
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for n in range(args.warmup + args.steps, args.warmup + args.steps + args.profile_steps):
                for bk in (backends if n % 2 == 0 else backends[::-1]):
                    step(bk, n, record_function("step:" + bk))
        for bk in backends:
            runs[bk]["out"]["shares"] = comm_shares(prof, bk)
    if args.reference:
        # Every rank's batch at once through a plain model, the loss the mean
        # of the ranks' losses: the gradient the ranks average.
        torch.manual_seed(args.seed)
        model = spec.make_model(torch)
        opt = spec.make_opt(model.parameters())
        ref = []
        for n in range(len(runs[backends[0]]["out"]["losses"])):
            parts = [spec.batch(n, r) for r in range(world)]
            opt.zero_grad(set_to_none=True)
            out = model(torch.cat([x for x, _ in parts]))
            per = [spec.loss(o, y) for o, (_, y) in zip(out.split([len(x) for x, _ in parts]), parts)]
            torch.stack(per).mean().backward()
            opt.step()
            ref.append(per[rank].item())
        for bk in backends:
            runs[bk]["out"]["ref_losses"] = ref
    for bk in backends:
        if runs[bk]["group"] is not None:
            dist.barrier(group=runs[bk]["group"])
    result = {bk: runs[bk]["out"] for bk in backends}
    if args.torchrun:
        # Every rank gets every rank's results, so all exit alike.
        gathered = [None] * world
        dist.all_gather_object(gathered, result)
        result = dict(enumerate(gathered))
    for bk in backends:
        if runs[bk]["group"] is not None:
            dist.destroy_process_group(runs[bk]["group"])
    dist.destroy_process_group()
    return result


def _fork_rank(rank, args, spec, store_path, q):
    try:
        q.put((rank, train_rank(rank, args.ranks, "file://" + store_path, args, spec)))
    except BaseException:  # noqa: B902 - reported to the parent, whatever it is
        q.put((rank, traceback.format_exc()))


def run(args, spec):
    """Results by backend, then rank; exits 2 when a rank failed."""
    if args.torchrun:
        res = train_rank(int(os.environ["RANK"]), args.ranks, "env://", args, spec)
        return {bk: {r: res[r][bk] for r in res} for bk in args.backends}
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="train-")
    procs = [ctx.Process(target=_fork_rank, args=(r, args, spec, os.path.join(tmp, "store"), q))
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
    return {bk: {r: res[r][bk] for r in res} for bk in args.backends}


def _compare(name_a, name_b, la_by_rank, lb_by_rank, args, say):
    """Prints rank 0's losses side by side (and any step outside the
    tolerance); returns True when they all agree."""
    ok, worst = True, 0.0
    say(f"{'step':>4} {'rank':>4} {name_a + ' loss':>16} {name_b + ' loss':>16} {'|diff|':>10}")
    for r in sorted(la_by_rank):
        for s, (x, y) in enumerate(zip(la_by_rank[r], lb_by_rank[r])):
            d = abs(x - y)
            worst = max(worst, d) if not math.isnan(d) else math.inf
            bad = not d <= args.atol + args.rtol * abs(x)
            if r == 0 or bad:
                say(f"{s:>4} {r:>4} {x:>16.8f} {y:>16.8f} {d:>10.2e}")
            ok = ok and not bad
    say(f"max |loss difference| over every rank and step: {worst:.3e} "
        f"({'within' if ok else 'OUTSIDE'} rtol {args.rtol} atol {args.atol})")
    return ok


def report(args, results, what):
    """Prints the checks and the figures (rank 0 only under torchrun) and
    exits: 0 when the losses agree, 1 when they differ, 3 when loom is
    below --min-speedup."""
    say = print if os.environ.get("RANK", "0") == "0" else (lambda *a, **k: None)
    backends = args.backends
    mode = "torchrun" if args.torchrun else "forked"
    say(f"{what}; {args.ranks} processes ({mode}), torch threads {args.threads} "
        f"(OpenBLAS {os.environ['OPENBLAS_NUM_THREADS']}), {args.warmup} warmup + {args.steps} timed steps")
    status = 0
    if len(backends) == 2:
        a, b = backends
        if not _compare(a, b, {r: v["losses"] for r, v in results[a].items()},
                        {r: v["losses"] for r, v in results[b].items()}, args, say):
            status = 1
    if args.reference:
        for bk in backends:
            say(f"{bk} against the reference (one plain model, every rank's batch):")
            if not _compare(bk, "reference", {r: v["losses"] for r, v in results[bk].items()},
                            {r: v["ref_losses"] for r, v in results[bk].items()}, args, say):
                status = 1
    med = {}
    for bk in backends:
        # a step takes as long as its slowest rank
        per_step = [max(results[bk][r]["times"][i] for r in results[bk]) for i in range(args.steps)]
        med[bk] = median(per_step)
        line = f"{bk:>6}: {med[bk] * 1e3:9.2f} ms per step (median of {args.steps}, slowest rank)"
        ph = [median([p[k] for p in results[bk][0]["phases"]]) * 1e3 for k in range(3)]
        line += f"; rank 0 forward/backward/optimizer {ph[0]:.1f}/{ph[1]:.1f}/{ph[2]:.1f} ms"
        say(line)
        if args.profile:
            sh = [s for r in results[bk] for s in results[bk][r]["shares"]]
            parts = " ".join(f"{k} {median([s[k] for s in sh]) * 100:.0f}%" for k in COLLECTIVE_KINDS)
            say(f"{bk:>6}: profiler, share of the step with a collective in flight (median over "
                f"{len(sh)} rank-steps): {median([s['any'] for s in sh]) * 100:.0f}% ({parts})")
    if "gloo" in med and "loom" in med:
        ratio = med["gloo"] / med["loom"]
        say(f"loom is {ratio:.2f}x as fast as gloo per step ({args.ranks} processes)")
        if args.min_speedup and ratio < args.min_speedup and status == 0:
            say(f"FAIL: below the required {args.min_speedup}x")
            status = 3
    if status == 1:
        say("FAIL: the losses differ")
    sys.exit(status)
