#!/usr/bin/python3
"""Tables and a plot from the raw results of perf/compare_host.sh.

    summarize.py OUTDIR [LATENCY_BELOW_BYTES]

reads OUTDIR/raw.csv (impl,coll,ranks,round,size,time_us,busbw,
inplace_time_us,inplace_busbw; memcpy rows carry THREADS in ranks and the
per-copy GB/s in busbw), OUTDIR/skipped.txt and OUTDIR/meta.txt, and writes
OUTDIR/summary.txt (also printed), OUTDIR/plot/*.dat and, with gnuplot,
OUTDIR/busbw.png through perf/baselines/plot.gp. Only the standard library:
it runs where torch is missing.
"""
import csv
import math
import os
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict

IMPLS = ["loom", "loom_socket", "mpi_shm", "impi_shm", "mpi_tcp", "gloo"]
NAMES = {"loom": "Loom shm", "loom_socket": "Loom sock", "mpi_shm": "MPI shm", "impi_shm": "IMPI shm",
         "mpi_tcp": "MPI tcp", "gloo": "Gloo"}
# (peer, the Loom figure it is set against): each transport against its
# counterpart, and Gloo, which only has TCP, against both of Loom's.
RATIOS = [("mpi_shm", "loom"), ("impi_shm", "loom"), ("mpi_tcp", "loom_socket"), ("gloo", "loom"),
          ("gloo", "loom_socket")]
COLLS = ["allreduce", "allgather", "reducescatter"]


def busf(coll, n):
    return 2.0 * (n - 1) / n if coll == "allreduce" else (n - 1) / n


def human(n):
    for unit, k in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return "%d%s" % (n >> k, unit)
    return str(n)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def load(out):
    times, memcpy = defaultdict(list), defaultdict(list)
    with open(os.path.join(out, "raw.csv")) as f:
        for row in csv.DictReader(f):
            if row["impl"] == "memcpy":
                memcpy[int(row["ranks"])].append(float(row["busbw"]))
                continue
            size = int(row["size"])
            if size <= 0:
                continue  # nccl-tests' rows of sizes that leave no element per rank
            key = (row["impl"], row["coll"], int(row["ranks"]), size)
            times[key].append(float(row["time_us"]))
            if row.get("inplace_time_us"):
                times[(row["impl"] + "_ip",) + key[1:]].append(float(row["inplace_time_us"]))
    skipped = {}
    path = os.path.join(out, "skipped.txt")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                impl, coll, n, why = line.rstrip("\n").split(" ", 3)
                skipped.setdefault((impl, coll, int(n)), why)
    meta = []
    path = os.path.join(out, "meta.txt")
    if os.path.exists(path):
        with open(path) as f:
            meta = [line.rstrip("\n") for line in f]
    return times, memcpy, skipped, meta


def main():
    out = sys.argv[1]
    lat_below = int(sys.argv[2]) if len(sys.argv) > 2 else 65536
    times, memcpy, skipped, meta = load(out)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    rounds = {k: len(v) for k, v in times.items()}
    # busbw from the median time rather than from the printed busbw, which
    # Loom's tools round to 2 decimals (0.00 at small sizes); the formula is
    # the one every tool uses, so this is the median busbw as well.
    bw = {k: k[3] / (t * 1e3) * busf(k[1], k[2]) for k, t in med.items() if t > 0}

    lines = []
    say = lines.append
    say("# Loom against Open MPI, Intel MPI and Gloo on this host")
    for m in meta:
        say("# " + m)
    say("#")
    say("# Every figure is the median over the rounds of this run (the libraries interleaved in each")
    say("# round). Rows below %s give the time per call in us, the others busbw in GB/s (nccl-tests'" % human(lat_below))
    say("# formulas, size = the largest buffer of the call). ratio = peer time / Loom time at the same")
    say("# size (= Loom busbw / peer busbw): ABOVE 1 LOOM IS FASTER, below 1 the peer is. MPI is Open")
    say("# MPI, IMPI Intel MPI, both over shm set against Loom over shm; 'MPI tcp/Lsock' sets Open MPI")
    say("# over TCP against Loom over sockets (NCCL_SHM_DISABLE=1); Gloo, which only has")
    say("# TCP, is set against both. Gloo's all_reduce is in place (torch has no other form), so its")
    say("# AllReduce ratios use Loom's in-place figures; everything else is out of place.")

    bound_text(say, memcpy, bw)

    colls = [c for c in COLLS if any(k[1] == c for k in med)]
    ranks = sorted({k[2] for k in med})
    panels = []
    for coll in colls:
        for n in ranks:
            sizes = sorted({k[3] for k in med if k[1] == coll and k[2] == n and not k[0].endswith("_ip")})
            if not sizes:
                continue
            panels.append((coll, n, sizes))
            table(say, coll, n, sizes, med, bw, rounds, skipped, lat_below)
    if skipped:
        say("")
        say("Not measured:")
        for (impl, coll, n), why in sorted(skipped.items()):
            say("  %s %s %d ranks: %s" % (NAMES.get(impl, impl), coll, n, why))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    plot(out, panels, bw, memcpy)


def m2rank(memcpy):
    """Per-copy memcpy GB/s with two copies at once (the two ranks copy at
    the same time), else the one-thread figure."""
    for threads in (2, 1):
        if memcpy.get(threads):
            return statistics.median(memcpy[threads]), threads
    return None, None


def bound_text(say, memcpy, bw):
    # The bound is derived for 2 ranks alone.
    if not memcpy or not any(k[2] == 2 for k in bw):
        return
    say("")
    for threads in sorted(memcpy):
        v = memcpy[threads]
        say("memcpy of 256 MiB, %d thread%s at once: %.2f GB/s per copy (median of %d rounds, %.2f-%.2f)"
            % (threads, "s" if threads > 1 else "", statistics.median(v), len(v), min(v), max(v)))
    m, threads = m2rank(memcpy)
    say("Limit for a 2-rank AllReduce of B bytes, sizes well beyond the caches, with m = %.2f GB/s" % m)
    say("(the memcpy speed with %d cop%s at once, as the two ranks copy at the same time):"
        % (threads, "ies" if threads > 1 else "y"))
    say("  Whatever the algorithm, each rank must read its input (B) and write its output (B): what")
    say("  one memcpy of B moves, so time >= B/m and, busbw being algbw on 2 ranks (2(n-1)/n = 1),")
    say("  busbw <= m = %.2f GB/s. Loom's ring moves 2B more per rank through the shm FIFO (its own" % m)
    say("  B/2 in, the peer's B/2 out, the reduced B/2 in and out again), but the FIFO is a few slots")
    say("  that stay in cache, so only the input and output reach memory; were the FIFO traffic in")
    say("  memory too, the bound would be m/2 = %.2f GB/s. What moving each byte into shared memory" % (m / 2))
    say("  and out again reaches alone, with no reduction (perf/shm_floor exchange), the quick")
    say("  comparison (--quick) measures beside Loom: 40-48% of m on the host of perf/README.md.")
    big = sorted(k[3] for k in bw if k[0] == "loom" and k[1] == "allreduce" and k[2] == 2)
    if big:
        s = big[-1]
        b = bw[("loom", "allreduce", 2, s)]
        say("  Loom shm, 2-rank AllReduce at %s: %.2f GB/s = %.0f%% of that bound." % (human(s), b, 100 * b / m))


def table(say, coll, n, sizes, med, bw, rounds, skipped, lat_below):
    nr = max((rounds.get((i, coll, n, s), 0) for i in IMPLS for s in sizes), default=0)
    say("")
    say("== %s, %d ranks (float32%s, medians of %d round%s)"
        % (coll, n, " sum" if coll != "allgather" else "", nr, "s" if nr != 1 else ""))
    head = "%7s %4s" % ("size", "unit") + "".join(" %9s" % NAMES[i] for i in IMPLS)
    head += "  |" + "".join(" %13s" % ("%s/%s" % (NAMES[p], "Lshm" if l == "loom" else "Lsock")) for p, l in RATIOS)
    say(head)
    lat, bwr = defaultdict(list), defaultdict(list)
    for s in sizes:
        unit = "us" if s < lat_below else "GB/s"
        row = "%7s %4s" % (human(s), unit)
        for impl in IMPLS:
            k = (impl, coll, n, s)
            if k in med:
                row += " %9.2f" % (med[k] if unit == "us" else bw.get(k, 0.0))
            else:
                row += " %9s" % ("n/a" if (impl, coll, n) in skipped else "-")
        row += "  |"
        for peer, ref in RATIOS:
            if peer == "gloo" and coll == "allreduce":
                ref += "_ip"
            pk, lk = (peer, coll, n, s), (ref, coll, n, s)
            if pk in med and lk in med and med[lk] > 0:
                r = med[pk] / med[lk]
                (lat if unit == "us" else bwr)[(peer, ref)].append(r)
                row += " %13.2f" % r
            else:
                row += " %13s" % "-"
        say(row)
    foot = "%7s %4s" % ("geomean", "") + " " * 10 * len(IMPLS) + "  |"
    for peer, ref in RATIOS:
        if peer == "gloo" and coll == "allreduce":
            ref += "_ip"
        parts = [("%.2f" % g) if g else "-" for g in (geomean(lat[(peer, ref)]), geomean(bwr[(peer, ref)]))]
        foot += " %13s" % "/".join(parts)
    say(foot + "   (time rows / busbw rows)")


def plot(out, panels, bw, memcpy):
    if not panels:
        print("(no plot: no results)")
        return
    d = os.path.join(out, "plot")
    os.makedirs(d, exist_ok=True)
    names = []
    for coll, n, sizes in panels:
        name = "%s_%d" % (coll, n)
        names.append(name)
        with open(os.path.join(d, name + ".dat"), "w") as f:
            f.write("size " + " ".join('"%s"' % NAMES[i] for i in IMPLS) + "\n")
            for s in sizes:
                cells = []
                for impl in IMPLS:
                    v = bw.get((impl, coll, n, s))
                    cells.append("%.6g" % v if v and v > 0 else "-")
                f.write("%d %s\n" % (s, " ".join(cells)))
    if not shutil.which("gnuplot"):
        print("(no plot: gnuplot is missing; apt-get install gnuplot-nox. Data in %s)" % d)
        return
    m, _ = m2rank(memcpy)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot.gp")
    png = os.path.join(out, "busbw.png")
    ncols = len({n for _, n, _ in panels})
    args = "datadir='%s'; panels='%s'; ncols=%d; output='%s'; bound=%g" % (d, " ".join(names), ncols, png, m if m else 0)
    r = subprocess.run(["gnuplot", "-e", args, script], capture_output=True, text=True)
    errors = [l for l in r.stderr.splitlines() if l.strip() and "no valid points" not in l]
    if r.returncode == 0:
        print("plot: %s" % png)
    else:
        print("plot: gnuplot failed: %s" % "\n".join(errors))


if __name__ == "__main__":
    main()
