#!/usr/bin/env python3
"""A paper model of Loom's CUDA ring AllReduce on one DGX H100 (issue 25).

No GPU has run any of this: every constant below is an assumption, named,
with its source or reasoning (docs/gpu-performance.md has the same table).
The model predicts the bus bandwidth of the kernel as it is today (BEFORE)
and as issue 25 redesigns it (AFTER), per lane (one thread block moving one
ring channel) and per node, next to NCCL's figures.

  perf/gpu_model.py                      the tables
  perf/gpu_model.py --check              exit 0 iff AFTER at 256 MiB is within
                                         1.5x of NCCL's ring figure and BEFORE
                                         is not
  perf/gpu_model.py --json               everything as JSON
  perf/gpu_model.py --lanes 16 --unroll 2 --piece-kib 256 ...
                                         override the AFTER design

Python 3 standard library only.
"""
import argparse
import json
import math
import sys

# ---- the machine: DGX H100 (tests/topo/dgx_h100.xml) ------------------------
N_GPUS = 8                    # ranks of the ring, one per GPU
NVLINK_LINKS = 18             # NVLink4 links per H100 SXM (fixture: count="18")
NVLINK_LINK_GBS = 25.0        # per link per direction, raw (H100: 900 GB/s bidirectional / 18 / 2)
NVLINK_USABLE_LINK_GBS = 20.6  # per link, what NCCL counts on for sm90 (NCCL src/graph/topo.h SM90_NVLINK_BW)
HBM_GBS = 3350.0              # H100 SXM5 80 GB HBM3, NVIDIA's datasheet
HBM_EFFICIENCY = 0.9          # streaming reaches ~90% of the datasheet figure (assumption)
HBM_BYTES_PER_SENT = 3.5      # HBM traffic per byte a rank sends: read input + read slot + peer's write
                              # into our slot (3), + write output in the last n-1 steps (4); about 3.5
SM_L2_BYTES_PER_CLK = 5120.0 / 108  # A100 whitepaper: L2 read bandwidth 5120 B/clk over 108 SMs;
                                    # assumed no lower per SM on H100
SM_CLOCK_GHZ = 1.98           # H100 SXM5 max boost clock
SM_BYTES_PER_OUTPUT = 3.0     # a reduce-send loads 2 bytes and stores 1 per byte it sends;
                              # recv-copy-send loads 1 and stores 2

# ---- latencies (us) -------------------------------------------------------
HBM_LATENCY_US = 0.6          # a load from local HBM under streaming load (idle ~0.3-0.5; assumption)
REMOTE_LATENCY_US = 0.9       # an NVLink write until it is performed at the peer (what a system
                              # fence waits for), through NVSwitch (assumption, 0.7-1 us)
PCIE_READ_US = 1.5            # a GPU read of mapped host memory over PCIe, round trip (assumption, 1-2 us)
BARRIER_US = 0.05             # __syncthreads of 16 warps
RELEASE_US = 0.1              # issuing a st.release.sys after a fence (posted)
STEP_SETUP_US = 0.6           # per schedule step: thread 0 expands the step from device memory
                              # (sched_at) and two barriers
LAUNCH_US = 4.0               # cudaLaunchKernel until the blocks run, small kernel (assumption, 3-5 us)
PLAN_COPY_US = 4.0            # cudaMemcpyAsync of the plan host-to-device before each launch (3-6 us)
LL_HOP_US = 1.0               # LL: one NVLink write of data+flag until the peer's poll sees it
                              # (issue: 1-2 us; NCCL's own model: 0.6, tuning.cc hwLat NVLink Ring LL)

# ---- the kernel -----------------------------------------------------------
THREADS = 512                 # DEV_THREADS (src/exec/cuda/dev.h)
PACK_BYTES = 16               # one uint4 per thread per source per iteration
LL_DATA_BYTES = 4             # LL: each 8-byte store carries 4 bytes of data and a 4-byte flag
NCCL_STEPS = 8                # slots per connection

# ---- NCCL's figures (8 x H100 SXM, NVSwitch) ------------------------------
NCCL_RING_BUSBW_256M = 360.0  # ring AllReduce busbw, GB/s: ~370 at 2-4 GB (NVIDIA, nccl-tests#212;
                              # nccl#1455: 365-370 for 2..8 GPUs), a little less at 256 MiB
NCCL_NVLS_BUSBW = 480.0       # NVLink SHARP AllReduce busbw at large sizes (same sources; 468.6
                              # at 2 GiB on p5.48xlarge, aws-samples/aws-do-eks)
# NCCL's own latency/bandwidth model (src/graph/tuning.cc, 2.19 and later) for sizes with no
# published H100 ring figure: time = baseLat + 2(n-1) * hwLat + size / algbw.
NCCL_BASE_LAT_US = {"LL": 6.6, "Simple": 8.4}
NCCL_HW_LAT_NVLINK_US = {"LL": 0.6, "Simple": 3.4}
NCCL_LL_BW_FRACTION = 0.25    # tuning.cc: ring LL busbw = ring busbw / 4 for AllReduce (capped at 141 on Hopper)
NCCL_LL_MAX_BUSBW = 141.0

ACCEPT_RATIO = 1.5
SIZES = [("8 B", 8), ("1 MiB", 1 << 20), ("256 MiB", 256 << 20)]
FIXTURE_NICS = 8              # <nic> elements in tests/topo/dgx_h100.xml


class Design:
    """One version of the kernel: the knobs issue 25 turns."""

    def __init__(self, name, lanes, unroll, piece_kib, lean, overlap, plan_in_params, ll, lane_min_kib=512):
        self.name = name
        self.lanes = lanes                    # thread blocks = ring channels
        self.lane_min_kib = lane_min_kib      # a call uses one lane per this much data (tuner.c: 512 KiB)
        self.unroll = unroll                  # 16-byte packs per source in flight per thread
        self.piece_kib = piece_kib            # data per slot = NCCL_BUFFSIZE / NCCL_STEPS
        self.lean = lean                      # one fence by one thread, no host read per piece
        self.overlap = overlap                # a warp does the handshake while the others move data
        self.plan_in_params = plan_in_params  # no host-to-device copy of the plan per launch
        self.ll = ll                          # LL protocol available for small messages

    def copy(self, **kw):
        d = Design(**self.__dict__)
        d.__dict__.update(kw)
        return d


def before_design(lanes=max(2, FIXTURE_NICS)):
    # topo_default_channels: max(2, NICs); the fixture has 8 NICs.
    return Design("BEFORE", lanes, 1, 2048 // NCCL_STEPS, False, False, False, False)


def after_design():
    # Lanes from NVLink: 450 GB/s over ~19 GB/s a block, capped at 32 -> 24.
    return Design("AFTER", 24, 4, 4096 // NCCL_STEPS, True, True, True, True)


def nvlink_usable_gbs():
    return NVLINK_LINKS * NVLINK_USABLE_LINK_GBS


def node_cap_gbs():
    """What one GPU can send per second, whatever the kernel."""
    return min(nvlink_usable_gbs(), HBM_GBS * HBM_EFFICIENCY / HBM_BYTES_PER_SENT)


def sm_copy_limit_gbs():
    return SM_L2_BYTES_PER_CLK * SM_CLOCK_GHZ / SM_BYTES_PER_OUTPUT


def lane_raw_gbs(d):
    """One block streaming with no handshakes: Little's law on its loads
    (the data path pushes: loads are local, stores go over NVLink posted),
    capped by what one SM moves."""
    little = THREADS * PACK_BYTES * d.unroll / (HBM_LATENCY_US * 1e3)  # bytes/ns = GB/s
    return min(little, sm_copy_limit_gbs())


def lane_share_gbs(d, proto):
    """A lane's streaming rate, its share of the node's links included."""
    if proto == "LL":
        little = THREADS * LL_DATA_BYTES * d.unroll / (HBM_LATENCY_US * 1e3)
        return min(little, sm_copy_limit_gbs() / 2, 0.5 * node_cap_gbs() / d.lanes)
    return min(lane_raw_gbs(d), node_cap_gbs() / d.lanes)


def handshake_us(d):
    """Per-piece synchronisation work: poll the tail, read the header, poll
    the head, then publish. BEFORE: every thread fences after the data, a
    second fence after the header, and a volatile read-modify-write of a
    counter in host memory. Lean: one fence by one thread, no host read."""
    polls = 3 * HBM_LATENCY_US
    if d.lean:
        return polls + 2 * BARRIER_US + REMOTE_LATENCY_US + 2 * RELEASE_US
    return polls + 2 * BARRIER_US + 2 * REMOTE_LATENCY_US + 2 * RELEASE_US + PCIE_READ_US


def piece_period_us(d, piece_bytes, bw):
    data = piece_bytes / (bw * 1e3)
    if d.overlap:
        return max(data, handshake_us(d)) + BARRIER_US
    return data + handshake_us(d)


def allreduce(d, size, proto):
    """Time (us) and busbw (GB/s) of a ring AllReduce of `size` bytes."""
    n = N_GPUS
    steps = 2 * (n - 1)
    # The tuner gives a call one lane per lane_min_kib of data (at least one).
    lanes = min(d.lanes, max(1, size // (d.lane_min_kib * 1024)))
    chunk = size / (lanes * n)               # bytes a lane moves per ring step
    fixed = LAUNCH_US + (0.0 if d.plan_in_params else PLAN_COPY_US)
    dd = d.copy(lanes=lanes)
    bw = lane_share_gbs(dd, proto)
    if proto == "LL":
        step = LL_HOP_US + chunk / (bw * 1e3) + STEP_SETUP_US
        pieces = 1
        lane_eff = chunk / (step - STEP_SETUP_US) / 1e3 if chunk else 0.0
    else:
        piece = d.piece_kib * 1024
        pieces = max(1, math.ceil(chunk / piece))
        per = piece_period_us(d, chunk / pieces, bw)
        # The peer's last release reaches us REMOTE_LATENCY_US after it is
        # issued; later pieces of the same step, and BEFORE's host read after
        # the release, hide part of it.
        hidden = (pieces - 1) * per + (0.0 if d.lean else PCIE_READ_US)
        step = pieces * per + max(0.0, REMOTE_LATENCY_US - hidden) + STEP_SETUP_US
        lane_eff = (chunk / pieces) / per / 1e3
    t = fixed + steps * step
    busbw = size / (t * 1e3) * steps / n
    return {"time_us": t, "busbw_gbs": busbw, "lanes": lanes, "pieces_per_step": pieces,
            "lane_stream_gbs": bw, "lane_eff_gbs": lane_eff}


def nccl_reference(size):
    """(busbw, where it comes from) for NCCL's ring AllReduce on 8 x H100."""
    if size >= 256 << 20:
        return NCCL_RING_BUSBW_256M, "published"
    n = N_GPUS
    steps = 2 * (n - 1)
    ring_bus = nvlink_usable_gbs()
    best = None
    for proto in ("LL", "Simple"):
        bus = min(NCCL_LL_MAX_BUSBW, ring_bus * NCCL_LL_BW_FRACTION) if proto == "LL" else ring_bus
        algbw = bus * n / steps
        t = NCCL_BASE_LAT_US[proto] + steps * NCCL_HW_LAT_NVLINK_US[proto] + size / (algbw * 1e3)
        if best is None or t < best:
            best = t
    return size / (best * 1e3) * steps / n, "NCCL's model"


LANE_MIN_KIB_PROPOSED = 32   # not in issue 25: a lane per 32 KiB, as NCCL's LL thresholds spread 1 MiB


def evaluate(before, after):
    rows = []
    more = after.copy(name="AFTER+", lane_min_kib=min(after.lane_min_kib, LANE_MIN_KIB_PROPOSED))
    for label, size in SIZES:
        ref, src = nccl_reference(size)
        designs = [before, after]
        # AFTER+ differs only where the lane rule leaves lanes idle
        if allreduce(more, size, "Simple")["lanes"] != allreduce(after, size, "Simple")["lanes"]:
            designs.append(more)
        for d in designs:
            for proto in ("Simple", "LL"):
                if proto == "LL" and not d.ll:
                    continue
                r = allreduce(d, size, proto)
                r.update({"design": d.name, "size": label, "bytes": size, "proto": proto,
                          "nccl_busbw_gbs": ref, "nccl_source": src,
                          "nccl_time_us": size / (ref * 1e3) * 2 * (N_GPUS - 1) / N_GPUS,
                          "nccl_over_loom": ref / r["busbw_gbs"]})
                rows.append(r)
    return rows


CHANGES = [
    ("1 lanes from NVLink", "lanes"),
    ("2 unroll + __restrict__", "unroll"),
    ("3 one fence, no host read", "lean"),
    ("4 handshake warp (overlap)", "overlap"),
    ("5 512 KiB slots", "piece_kib"),
    ("6 plan in kernel params", "plan_in_params"),
    ("7 LL for small messages", "ll"),
]


def best_time(d, size):
    protos = ("Simple", "LL") if d.ll else ("Simple",)
    return min((allreduce(d, size, p) for p in protos), key=lambda r: r["time_us"])


def ablation(before, after):
    """Each change alone on BEFORE, and AFTER without it."""
    out = []
    for label, field in CHANGES:
        only = before.copy(**{field: getattr(after, field)})
        without = after.copy(**{field: getattr(before, field)})
        row = {"change": label}
        for slabel, size in SIZES:
            # 8 B by its time, the others by busbw
            key = "time_us" if size < 1024 else "busbw_gbs"
            row["only_" + slabel] = best_time(only, size)[key]
            row["without_" + slabel] = best_time(without, size)[key]
        out.append(row)
    return out


def fmt_bw(x):
    return "%.3f" % x if x < 1 else "%.1f" % x


def describe(d):
    return ("%s: %d lanes, unroll %d, %d KiB pieces, %s handshake%s, plan %s, LL %s" %
            (d.name, d.lanes, d.unroll, d.piece_kib, "lean" if d.lean else "serial",
             " overlapped" if d.overlap else "", "in params" if d.plan_in_params else "copied",
             "yes" if d.ll else "no"))


def report(before, after, rows, abl):
    p = print
    p("Loom CUDA ring AllReduce on DGX H100 (8 GPUs, NVSwitch): a model, no GPU has run it")
    p("  " + describe(before))
    p("  " + describe(after))
    p("  AFTER+: AFTER with a lane per %d KiB of a call instead of per %d KiB (not in issue 25)" %
      (LANE_MIN_KIB_PROPOSED, after.lane_min_kib))
    p("  node cap %.1f GB/s (NVLink %d x %.1f usable of %.0f raw; HBM cap %.0f), SM copy limit %.1f GB/s a lane" %
      (node_cap_gbs(), NVLINK_LINKS, NVLINK_USABLE_LINK_GBS, NVLINK_LINK_GBS,
       HBM_GBS * HBM_EFFICIENCY / HBM_BYTES_PER_SENT, sm_copy_limit_gbs()))
    for d in (before, after):
        p("  %s lane: streams %.1f GB/s (Little's law %.1f), handshake %.2f us a piece%s" %
          (d.name, lane_raw_gbs(d), THREADS * PACK_BYTES * d.unroll / (HBM_LATENCY_US * 1e3),
           handshake_us(d), " (overlapped)" if d.overlap else " (serial)"))
    p("")
    p("| size | design | proto | lanes | pieces/step | lane GB/s | time us | busbw GB/s | NCCL us | NCCL GB/s | NCCL/Loom |")
    p("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p("| %s | %s | %s | %d | %d | %s | %.1f | %s | %.1f | %s (%s) | %.2f |" %
          (r["size"], r["design"], r["proto"], r["lanes"], r["pieces_per_step"], fmt_bw(r["lane_eff_gbs"]),
           r["time_us"], fmt_bw(r["busbw_gbs"]), r["nccl_time_us"], fmt_bw(r["nccl_busbw_gbs"]),
           r["nccl_source"], r["nccl_over_loom"]))
    p("")
    p("Each change of issue 25 alone on BEFORE, and AFTER without it (8 B: time in us; others: busbw GB/s;")
    p("the better protocol the design has):")
    p("")
    p("| change | only: 8 B us | only: 1 MiB | only: 256 MiB | without: 8 B us | without: 1 MiB | without: 256 MiB |")
    p("|---|---|---|---|---|---|---|")
    for a in abl:
        p("| %s | %s | %s | %s | %s | %s | %s |" %
          (a["change"], fmt_bw(a["only_8 B"]), fmt_bw(a["only_1 MiB"]), fmt_bw(a["only_256 MiB"]),
           fmt_bw(a["without_8 B"]), fmt_bw(a["without_1 MiB"]), fmt_bw(a["without_256 MiB"])))
    p("")
    big = 256 << 20
    p("BEFORE elsewhere: %s" % ", ".join(
        "%d lanes (%s) %.1f GB/s at 256 MiB" % (n, why, allreduce(before.copy(lanes=n), big, "Simple")["busbw_gbs"])
        for n, why in ((12, "a real DGX H100's NIC ports, the issue's estimate"), (2, "a host without NICs"))))
    v = verdict(before, after)
    p("256 MiB: BEFORE %.1f GB/s (NCCL/Loom %.2f), AFTER %.1f GB/s (NCCL/Loom %.2f); bar: NCCL ring %.0f / %.1f = %.0f GB/s" %
      (v["before"], NCCL_RING_BUSBW_256M / v["before"], v["after"], NCCL_RING_BUSBW_256M / v["after"],
       NCCL_RING_BUSBW_256M, ACCEPT_RATIO, v["bar"]))
    p("AFTER meets the bar while one lane streams >= %.1f GB/s, i.e. (Little's law, unroll %d) while a load's"
      " latency stays under %.1f us; NVLS would be %.0f GB/s (NCCL/Loom %.2f)" %
      (v["lane_needed"], after.unroll, v["latency_limit_us"], NCCL_NVLS_BUSBW, NCCL_NVLS_BUSBW / v["after"]))
    p("check: %s" % ("pass" if v["ok"] else "FAIL"))


def verdict(before, after):
    size = 256 << 20
    b = allreduce(before, size, "Simple")["busbw_gbs"]
    a = allreduce(after, size, "Simple")["busbw_gbs"]
    bar = NCCL_RING_BUSBW_256M / ACCEPT_RATIO
    # The lane rate at which AFTER's node busbw reaches the bar.
    lane_needed = bar / after.lanes / piece_duty(after)
    latency_limit = THREADS * PACK_BYTES * after.unroll / (lane_needed * 1e3)
    return {"before": b, "after": a, "bar": bar, "ok": a >= bar and b < bar,
            "lane_needed": lane_needed, "latency_limit_us": latency_limit}


def piece_duty(d):
    """The fraction of a piece's period that moves data, at the lane's rate."""
    bw = lane_share_gbs(d, "Simple")
    piece = d.piece_kib * 1024
    return piece / (bw * 1e3) / piece_period_us(d, piece, bw)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 0 iff AFTER meets the 1.5x bar and BEFORE does not")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--lanes", type=int, help="AFTER lanes (24)")
    ap.add_argument("--unroll", type=int, help="AFTER packs in flight per source per thread (4)")
    ap.add_argument("--piece-kib", type=int, help="AFTER slot payload in KiB (512)")
    ap.add_argument("--no-lean", action="store_true", help="AFTER keeps BEFORE's per-piece fences and host read")
    ap.add_argument("--no-overlap", action="store_true", help="AFTER handshake serial, no dedicated warp")
    ap.add_argument("--plan-copy", action="store_true", help="AFTER still copies the plan before each launch")
    ap.add_argument("--no-ll", action="store_true", help="AFTER without the LL protocol")
    ap.add_argument("--lane-min-kib", type=int, help="AFTER: data per lane before a call uses another (512, tuner.c)")
    ap.add_argument("--before-lanes", type=int, help="BEFORE lanes (8: the fixture's NICs; 12 real DGX; 2 no NIC)")
    ap.add_argument("--hbm-latency-us", type=float, help="HBM_LATENCY_US (%.2f)" % HBM_LATENCY_US)
    ap.add_argument("--remote-latency-us", type=float, help="REMOTE_LATENCY_US (%.2f)" % REMOTE_LATENCY_US)
    a = ap.parse_args(argv)
    for name in ("lanes", "unroll", "piece_kib", "lane_min_kib", "before_lanes"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            ap.error("--%s must be at least 1" % name.replace("_", "-"))
    for name in ("hbm_latency_us", "remote_latency_us"):
        if getattr(a, name) is not None and not getattr(a, name) > 0:
            ap.error("--%s must be positive" % name.replace("_", "-"))
    g = globals()
    if a.hbm_latency_us is not None:
        g["HBM_LATENCY_US"] = a.hbm_latency_us
    if a.remote_latency_us is not None:
        g["REMOTE_LATENCY_US"] = a.remote_latency_us
    before = before_design(min(a.before_lanes, 32)) if a.before_lanes is not None else before_design()
    after = after_design()
    if a.lanes is not None:
        after.lanes = min(a.lanes, 32)  # the channel limit (NCCL_MAX_NCHANNELS)
    if a.unroll is not None:
        after.unroll = a.unroll
    if a.piece_kib is not None:
        after.piece_kib = a.piece_kib
    if a.lane_min_kib is not None:
        after.lane_min_kib = a.lane_min_kib
    after.lean = not a.no_lean
    after.overlap = not a.no_overlap
    after.plan_in_params = not a.plan_copy
    after.ll = not a.no_ll
    rows = evaluate(before, after)
    abl = ablation(before, after)
    v = verdict(before, after)
    if a.json:
        json.dump({"before": before.__dict__, "after": after.__dict__, "rows": rows, "ablation": abl,
                   "verdict": v}, sys.stdout, indent=1)
        print()
    elif not a.check:
        report(before, after, rows, abl)
    if a.check:
        print("gpu_model: 256 MiB busbw BEFORE %.1f, AFTER %.1f GB/s; bar %.0f (NCCL ring %.0f / %.1f): %s" %
              (v["before"], v["after"], v["bar"], NCCL_RING_BUSBW_256M, ACCEPT_RATIO,
               "pass" if v["ok"] else "FAIL (AFTER must reach the bar and BEFORE must not)"))
        return 0 if v["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
