#!/usr/bin/env python3
"""How Loom's bootstrap grows with the number of ranks, beside Open MPI's
MPI_Init, on this host; fitted and projected to 10,000 and 100,000 ranks.

    perf/bootstrap_scale.py [--build build] [--ranks 2,4,...,128] [--reps 3]
                            [--threads-above N] [--no-mpi] [--lib DIR]

For each rank count it runs build/perf/bootstrap_scale (N processes, or
threads of one process above --threads-above or where fork fails) --reps
times and takes the medians of: ncclCommInitRank's time on the slowest
rank, TCP connections made to the bootstrap's listeners per rank and to the
busiest rank's listener (counted in the kernel's socket tables, so any
version of Loom is counted alike), and the bytes the root sent (its INFO
line). Beside it, MPI_Init's time on the slowest process of
`mpirun -np N build/perf/mpi_init_time` (Open MPI; as root with
--allow-run-as-root --oversubscribe). --lib runs the benchmark against
another libnccl.so.2 (an older build, for a before-and-after).

Fits: connections per rank and to the busiest listener as a + b*log2(N),
root bytes as a + b*N, init time as a + b*N and as c*N^k; the projections
use them. Ranks here share this host's cores, so time fits say how the
work grows, not what a cluster of 10,000 hosts would take.
"""
import argparse
import math
import os
import re
import shutil
import statistics
import subprocess
import sys


def run(cmd, env=None, timeout=900):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def fields(line):
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def loom_once(exe, n, threads, env):
    cmd = [exe, "-n", str(n)] + (["--threads"] if threads else [])
    rc, out, err = run(cmd, env)
    if rc != 0 and not threads and "fork" in err:
        return loom_once(exe, n, True, env)
    lines = [l for l in out.splitlines() if l.startswith("n=")]
    if rc != 0 or not lines:
        sys.exit("bootstrap_scale -n %d failed (%d): %s" % (n, rc, err[-2000:]))
    return fields(lines[-1])


def mpi_once(exe, n):
    cmd = ["mpirun", "-np", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    rc, out, err = run(cmd + [exe])
    lines = [l for l in out.splitlines() if l.startswith("n=")]
    if rc != 0 or not lines:
        print("# mpirun -np %d failed (%d): %s" % (n, rc, err.strip()[-300:]), file=sys.stderr)
        return None
    return fields(lines[-1])


def fit_line(xs, ys):
    """Least squares y = a + b*x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def fit_power(xs, ys):
    """y = c * x^k, by a line through the logs."""
    la, k = fit_line([math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys])
    return math.exp(la), k


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="2,4,8,16,32,64,128")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads-above", type=int, default=1 << 30)
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--lib", help="folder of the libnccl.so.2 to measure instead of the build's")
    a = ap.parse_args()
    exe = os.path.join(a.build, "perf", "bootstrap_scale")
    mpi_exe = os.path.join(a.build, "perf", "mpi_init_time")
    if not os.access(exe, os.X_OK):
        sys.exit("%s is missing: build first (cmake --build %s)" % (exe, a.build))
    use_mpi = not a.no_mpi and os.access(mpi_exe, os.X_OK) and shutil.which("mpirun")
    env = dict(os.environ)
    if a.lib:
        env["LD_LIBRARY_PATH"] = a.lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    ns = [int(x) for x in a.ranks.split(",")]
    rows = []
    for n in ns:
        threads = n > a.threads_above
        runs = [loom_once(exe, n, threads, env) for _ in range(a.reps)]
        med = lambda k: statistics.median(float(r[k]) for r in runs)
        row = {"n": n, "mode": runs[-1]["mode"], "init": med("init_max_s"), "coll": med("first_coll_max_s"),
               "conns": med("conns_per_rank"), "busiest": med("busiest"), "root": med("root_sent"),
               "mpi": None}
        if use_mpi:
            m = [mpi_once(mpi_exe, n) for _ in range(a.reps)]
            m = [x for x in m if x]
            if m:
                row["mpi"] = statistics.median(float(x["mpi_init_max_s"]) for x in m)
        rows.append(row)
        print("# n=%d done" % n, file=sys.stderr, flush=True)

    print("| ranks | ranks as | Loom init (slowest rank) | Open MPI MPI_Init (slowest) | first AllReduce | "
          "connections per rank | to the busiest listener | bytes the root sent |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        mpi = "%.3f s" % r["mpi"] if r["mpi"] is not None else "n/a"
        root = "%d" % r["root"] if r["root"] >= 0 else "n/a"
        print("| %d | %s | %.3f s | %s | %.3f s | %.2f | %d | %s |" % (r["n"], r["mode"], r["init"], mpi, r["coll"],
                                                                     r["conns"], r["busiest"], root))
    xs = [r["n"] for r in rows]
    lg = [math.log2(x) for x in xs]
    print()
    proj = [10000, 100000]
    ca, cb = fit_line(lg, [r["conns"] for r in rows])
    ba, bb = fit_line(lg, [r["busiest"] for r in rows])
    print("connections per rank = %.2f + %.2f*log2(N): %s" %
          (ca, cb, ", ".join("%.0f at %d" % (ca + cb * math.log2(p), p) for p in proj)))
    print("to the busiest listener = %.2f + %.2f*log2(N): %s" %
          (ba, bb, ", ".join("%.0f at %d" % (ba + bb * math.log2(p), p) for p in proj)))
    if all(r["root"] >= 0 for r in rows):
        ra, rb = fit_line(xs, [r["root"] for r in rows])
        print("bytes the root sends = %.0f + %.1f*N: %s" %
              (ra, rb, ", ".join("%.1f MB at %d" % ((ra + rb * p) / 1e6, p) for p in proj)))
    ia, ib = fit_line(xs, [r["init"] for r in rows])
    ic, ik = fit_power(xs, [r["init"] for r in rows])
    print("Loom init on this host = %.3f + %.4f*N s (%s); as a power, %.4f*N^%.2f s (%s)" %
          (ia, ib, ", ".join("%.0f s at %d" % (ia + ib * p, p) for p in proj), ic, ik,
           ", ".join("%.0f s at %d" % (ic * p ** ik, p) for p in proj)))
    mrows = [r for r in rows if r["mpi"] is not None]
    if len(mrows) >= 2:
        ma, mb = fit_line([r["n"] for r in mrows], [r["mpi"] for r in mrows])
        mc, mk = fit_power([r["n"] for r in mrows], [r["mpi"] for r in mrows])
        print("Open MPI MPI_Init on this host = %.3f + %.4f*N s (%s); as a power, %.4f*N^%.2f s (%s)" %
              (ma, mb, ", ".join("%.0f s at %d" % (ma + mb * p, p) for p in proj), mc, mk,
               ", ".join("%.0f s at %d" % (mc * p ** mk, p) for p in proj)))


if __name__ == "__main__":
    main()
