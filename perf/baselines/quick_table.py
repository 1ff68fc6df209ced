#!/usr/bin/python3
"""The ratio table of perf/compare_host.sh --quick.

    quick_table.py OUTDIR

reads OUTDIR/rows.txt (row,kind,ranks,bytes,warmup,iters), OUTDIR/raw.csv
(impl,coll,ranks,round,size,time_us,busbw,inplace_time_us,inplace_busbw;
memcpy rows carry THREADS in ranks and the per-copy GB/s in busbw),
OUTDIR/skipped.txt and OUTDIR/meta.txt, and writes OUTDIR/quick.csv
(row,lib,round,time_us: every round's time per call) and OUTDIR/summary.txt
(also printed): per row each library's median time per call with its range
over the rounds, the best peer and Loom's ratio against it. Only the
standard library: it runs where torch is missing.
"""
import csv
import os
import statistics
import sys
from collections import defaultdict

# Per kind of row: Loom's figure and the peers set against it.
KINDS = {
    "shm": ("loom", ["mpi_shm", "impi_shm", "gloo"]),
    "socket": ("loom_socket", ["mpi_tcp", "gloo"]),
}
NAMES = {"loom": "Loom shm", "loom_socket": "Loom sock", "mpi_shm": "Open MPI shm", "impi_shm": "Intel MPI shm",
         "mpi_tcp": "Open MPI tcp", "gloo": "Gloo", "loom_win": "Loom shm -R 2"}
# The floor of a 2-rank AllReduce on plain buffers through shared memory
# (perf/baselines/shm_floor.c exchange), run once per round at the 2-rank
# shm rows' sizes: raw.csv's impl for it.
FLOOR = "floor_exchange"
# Loom with its buffers in symmetric windows (all_reduce_perf -R 2), where
# the ranks read and write each other's in place: a column of its own,
# with its ratio against the same best peer beside Loom's.
EXTRA = {"shm": "loom_win"}


def human(n):
    for unit, k in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return "%d %siB" % (n >> k, unit)
    return "%d B" % n


def us(t):
    return "%.2f" % t if t < 10 else "%.1f" % t if t < 1000 else "%.0f" % t


def load(out):
    rows = []
    with open(os.path.join(out, "rows.txt")) as f:
        for r in csv.DictReader(f):
            rows.append((r["row"], r["kind"], int(r["ranks"]), int(r["bytes"]), int(r["warmup"]), int(r["iters"])))
    # (impl, ranks, bytes) -> {round: time}; Loom's in-place figure as
    # impl + "_inplace", for Gloo, whose all_reduce is in place.
    times, memcpy = defaultdict(dict), []
    with open(os.path.join(out, "raw.csv")) as f:
        for r in csv.DictReader(f):
            if r["impl"] == "memcpy":
                memcpy.append(float(r["busbw"]))
                continue
            if r["coll"] != "allreduce":
                continue
            key = (int(r["ranks"]), int(r["size"]))
            times[(r["impl"],) + key][int(r["round"])] = float(r["time_us"])
            if r.get("inplace_time_us"):
                times[(r["impl"] + "_inplace",) + key][int(r["round"])] = float(r["inplace_time_us"])
    skipped = {}
    path = os.path.join(out, "skipped.txt")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                impl, _, _, why = line.rstrip("\n").split(" ", 3)
                skipped.setdefault(impl, why)
    meta = []
    path = os.path.join(out, "meta.txt")
    if os.path.exists(path):
        with open(path) as f:
            meta = [line.rstrip("\n") for line in f]
    return rows, times, memcpy, skipped, meta


def main():
    out = sys.argv[1]
    rows, times, memcpy, skipped, meta = load(out)
    med = {k: statistics.median(v.values()) for k, v in times.items() if v}
    nrounds = max((r for v in times.values() for r in v), default=0)

    with open(os.path.join(out, "quick.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["row", "lib", "round", "time_us"])
        for name, kind, n, size, _, _ in rows:
            loom, peers = KINDS[kind]
            extra = [EXTRA[kind], EXTRA[kind] + "_inplace"] if kind in EXTRA else []
            floor = [FLOOR] if kind == "shm" and n == 2 else []
            for lib in [loom, loom + "_inplace"] + extra + peers + floor:
                for r, t in sorted(times.get((lib, n, size), {}).items()):
                    w.writerow([name, lib, r, "%.3f" % t])

    lines = []
    say = lines.append
    say("# Loom against Open MPI, Intel MPI and Gloo: the quick AllReduce comparison (float32 sum)")
    for m in meta:
        say("# " + m)
    say("#")
    say("# Time per call in us: the median over the rounds (the libraries interleaved in each round),")
    say("# its range in brackets. ratio = the best peer's time / Loom's time (the best peer being the")
    say("# one with the lowest ratio): ABOVE 1 LOOM IS FASTER; rows below 1 are marked '<'. Open MPI")
    say("# and Intel MPI are out of place, as is Loom's column; Gloo's all_reduce is in place, so its")
    say("# ratio uses Loom's in-place time (in quick.csv as loom_inplace, loom_socket_inplace).")
    say("# '%s' is Loom with its buffers in symmetric windows (all_reduce_perf -R 2, ncclMemAlloc and" % NAMES["loom_win"])
    say("# ncclCommWindowRegister), where the ranks read and write each other's buffers in place; its")
    say("# ratio against the same best peer is the last column ('-R 2').")
    below = 0
    for kind in KINDS:
        krows = [r for r in rows if r[1] == kind]
        if not krows:
            continue
        loom, peers = KINDS[kind]
        extra = EXTRA.get(kind)
        libs = [loom] + ([extra] if extra else []) + peers
        say("")
        say("== %s rows: %s against %s" % (kind, NAMES[loom], ", ".join(NAMES[p] for p in peers)))
        head = "%-15s %5s %6s" % ("row", "warm", "calls") + "".join(" %26s" % NAMES[l] for l in libs)
        say(head + "  %-13s %6s" % ("best peer", "ratio") + ("  %6s" % "-R 2" if extra else ""))
        for name, _, n, size, warm, iters in krows:
            cells = ""
            for lib in libs:
                v = times.get((lib, n, size))
                if v:
                    vals = list(v.values())
                    few = "" if len(vals) == nrounds else " %d/%d" % (len(vals), nrounds)
                    cell = "%s [%s-%s]%s" % (us(med[(lib, n, size)]), us(min(vals)), us(max(vals)), few)
                else:
                    cell = "n/a" if lib in skipped else "-"
                cells += " %26s" % cell
            best = None
            for p in peers:
                ref = (loom + "_inplace" if p == "gloo" else loom, n, size)
                if (p, n, size) in med and ref in med and med[ref] > 0:
                    r = med[(p, n, size)] / med[ref]
                    if best is None or r < best[1]:
                        best = (p, r)
            if best:
                mark = " <" if best[1] < 1 else ""
                below += best[1] < 1
                tail = "  %-13s %6.2f%s" % (NAMES[best[0]], best[1], mark)
            else:
                tail = "  %-13s %6s" % ("-", "-")
            if extra:
                ref = (extra + "_inplace" if best and best[0] == "gloo" else extra, n, size)
                if best and ref in med and med[ref] > 0:
                    tail += "%s  %6.2f" % ("" if best[1] < 1 else "  ", med[(best[0], n, size)] / med[ref])
                else:
                    tail += "  %6s" % "-"
            say("%-15s %5d %6d" % ("%s %s" % ("%dr" % n, human(size)), warm, iters) + cells + tail)
    ratios = sum(1 for r in rows if any((p, r[2], r[3]) in med for p in KINDS[r[1]][1]) and
                 (KINDS[r[1]][0], r[2], r[3]) in med)
    say("")
    say("%d of %d rows with a peer have Loom below 1.0" % (below, ratios))

    bound(say, memcpy, med)
    floors(say, rows, times, med, memcpy)
    if skipped:
        say("")
        say("Not measured:")
        for impl, why in sorted(skipped.items()):
            say("  %s: %s" % (NAMES.get(impl, impl), why))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)


def bound(say, memcpy, med):
    """The memcpy limit of a 2-rank AllReduce (derived in full mode's
    summary and in perf/README.md): each rank reads its input and writes
    its output, one memcpy of B, so time >= B / m."""
    if not memcpy:
        return
    m = statistics.median(memcpy)
    size = 64 << 20
    say("")
    say("memcpy of 256 MiB, two copies at once: m = %.2f GB/s per copy (median of %d rounds, %.2f-%.2f)"
        % (m, len(memcpy), min(memcpy), max(memcpy)))
    t_bound = size / (m * 1e3)
    line = "2-rank AllReduce of 64 MiB: bound B/m = %s us (busbw <= m)" % us(t_bound)
    t = med.get(("loom", 2, size))
    if t:
        line += "; Loom shm %s us = %.0f%% of the bound (busbw %.2f GB/s)" % (us(t), 100 * t_bound / t,
                                                                          size / (t * 1e3))
    say(line)
    for lib, how in (("loom_win", "out of place"), ("loom_win_inplace", "in place")):
        t = med.get((lib, 2, size))
        if t:
            say("  %s, %s: %s us = %.0f%% of the bound (busbw %.2f GB/s)" % (NAMES["loom_win"], how, us(t),
                                                                           100 * t_bound / t, size / (t * 1e3)))



def floors(say, rows, times, med, memcpy):
    """The 2-rank shm rows against the least their bytes can cost: each
    rank's buffer copied into shared memory and out of it by the peer, with
    no reduction and no library (shm_floor exchange, perf/README.md)."""
    sized = [(n, size) for _, kind, n, size, _, _ in rows if kind == "shm" and (FLOOR, n, size) in med]
    if not sized:
        return
    say("")
    say("2-rank floor, shm_floor exchange (each rank's buffer into shared memory and out of it by the")
    say("peer, no reduction: the least any AllReduce on plain buffers moves between two processes):")
    for n, size in sized:
        v = list(times[(FLOOR, n, size)].values())
        t = med[(FLOOR, n, size)]
        line = "  %s: %s us [%s-%s]" % (human(size), us(t), us(min(v)), us(max(v)))
        for lib in ("loom", "impi_shm", "mpi_shm"):
            if (lib, n, size) in med:
                line += "; %s %.2fx the floor" % (NAMES[lib], med[(lib, n, size)] / t)
        if memcpy and size == 64 << 20:
            line += "; the floor is %.0f%% of the memcpy bound B/m" % (100 * size / (statistics.median(memcpy) * 1e3) / t)
        say(line)


if __name__ == "__main__":
    main()
