#!/usr/bin/env python3
"""AllReduce algorithm crossovers on this host, measured against the tuner.

For each rank count, runs all_reduce_perf (float32 sum) with each algorithm
forced through NCCL_ALGO (Ring, Tree, RecursiveDoubling, Flat) and once with the
tuner's own choice, round after round, and prints per size the median time
of each, the fastest, the tuner's pick (from its NCCL_DEBUG_SUBSYS=TUNING
log) and what the pick costs against the fastest. Recursive doubling only
runs up to a FIFO's size, Flat only where the ranks share an arena (one
host, shared memory): elsewhere the forced run falls back to Ring and the
column says so.

  perf/crossover.py [--ranks "2 4 8"] [--min 8] [--max 1M] [--rounds 3]
      [--iters 200] [--warmup 20] [--build build-perf] [--out DIR]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ALGOS = [("Ring", "ring"), ("Tree", "tree"), ("RecursiveDoubling", "recursivedoubling"), ("Flat", "flat")]
SHORT = {"Ring": "ring", "Tree": "tree", "RecursiveDoubling": "rd", "Flat": "flat"}


def size_arg(s):
    m = re.fullmatch(r"(\d+)([KkMmGg]?)", s)
    if not m:
        raise argparse.ArgumentTypeError("bad size %r" % s)
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def human(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d%s" % (b >> shift, unit)
    return str(b)


def run(args, n, algo):
    """One all_reduce_perf run: {size: out-of-place us}, {size: the algorithm that ran}."""
    env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="TUNING")
    if algo:
        env["NCCL_ALGO"] = "allreduce:" + algo
    cmd = [os.path.join(args.build, "tools", "loomrun"), "-n", str(n),
           os.path.join(args.build, "perf", "all_reduce_perf"), "-b", str(args.min), "-e", str(args.max),
           "-f", "2", "-n", str(args.iters), "-w", str(args.warmup), "-c", "0"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        sys.exit("crossover.py: %s failed (%d):\n%s" % (" ".join(cmd), p.returncode, (p.stdout + p.stderr)[-2000:]))
    times, picks = {}, {}
    for line in (p.stdout + p.stderr).splitlines():
        f = line.split()
        if len(f) >= 13 and f[0].isdigit() and f[2] == "float":
            times[int(f[0])] = float(f[5])
        m = re.search(r"AllReduce of (\d+) bytes \(size class [^)]*\): (\w+),", line)
        if m:
            picks.setdefault(int(m.group(1)), m.group(2))
    return times, picks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2 4 8")
    ap.add_argument("--min", type=size_arg, default=8)
    ap.add_argument("--max", type=size_arg, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--build", default=os.environ.get("LOOM_PERF_BUILD", "build-perf"))
    ap.add_argument("--out", help="also write the table to DIR/crossover.txt")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if not os.access(os.path.join(args.build, "perf", "all_reduce_perf"), os.X_OK):
        sys.exit("crossover.py: no %s/perf/all_reduce_perf: build Loom there first (perf/compare_host.sh does) "
                 "or pass --build DIR" % args.build)
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    say("AllReduce float32 sum, out-of-place time per call in us, median of %d rounds (%d calls each); "
        "'auto' is the tuner's choice." % (args.rounds, args.iters))
    say("cost = auto / fastest forced. Crossovers: the smallest size from which each algorithm is the fastest.")
    for n in [int(x) for x in args.ranks.split()]:
        samples = {name: {} for name, _ in ALGOS + [("auto", None)]}
        ran = {name: {} for name, _ in ALGOS + [("auto", None)]}
        for _ in range(args.rounds):
            for name, algo in ALGOS + [("auto", None)]:
                times, p = run(args, n, algo)
                for s, t in times.items():
                    samples[name].setdefault(s, []).append(t)
                ran[name].update(p)
        picks = ran["auto"]
        sizes = sorted(samples["auto"])
        med = {k: {s: statistics.median(v) for s, v in d.items()} for k, d in samples.items()}
        say()
        say("== %d ranks" % n)
        say("%8s %9s %9s %9s %9s %9s  %-7s %-7s %6s" % ("size", "ring", "tree", "rd", "flat", "auto", "fastest", "tuner",
                                                     "cost"))
        wins = []
        for s in sizes:
            # A forced algorithm that cannot run a size (recursive doubling
            # above a FIFO) ran as Ring there: not its figure.
            forced = {SHORT[name]: med[name].get(s) if ran[name].get(s) == name else None for name, _ in ALGOS}
            valid = {k: v for k, v in forced.items() if v is not None}
            best = min(valid, key=valid.get)
            wins.append((s, best))
            pick = SHORT.get(picks.get(s, ""), "?")
            auto = med["auto"].get(s)
            cost = auto / valid[best] if auto and valid[best] else float("nan")
            cells = ["%9.2f" % forced[k] if forced[k] is not None else "%9s" % "-" for k in ("ring", "tree", "rd", "flat")]
            say("%8s %s %9.2f  %-7s %-7s %6.2f" % (human(s), " ".join(cells), auto, best, pick, cost))
        measured, tuned = [], []
        for seq, out in ((wins, measured), ([(s, SHORT.get(picks.get(s, ""), "?")) for s in sizes], tuned)):
            last = None
            for s, a in seq:
                if a != last:
                    out.append("%s from %s" % (a, human(s)))
                    last = a
        say("measured: " + ", ".join(measured))
        say("tuner:    " + ", ".join(tuned))
        costs = [med["auto"][s] / min(med[name][s] for name, _ in ALGOS if ran[name].get(s) == name)
                 for s in sizes if med["auto"].get(s)]
        if costs:
            say("tuner's choice against the fastest: geomean %.2f, worst %.2f"
                % (statistics.geometric_mean(costs), max(costs)))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "crossover.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
