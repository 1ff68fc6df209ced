#!/usr/bin/env python3
"""Runs PyTorch's own shared backend suite (DistributedTest._DistTestBase in
torch.testing._internal.distributed.distributed_test, which upstream runs
from test/distributed/test_distributed_spawn.py) against one backend, CPU
only:

    dist_suite.py --backend loom|gloo --world-size N [--chunk K/M] [--list]
                  [-k REGEX] [--timeout S] [--lift-gates] [--json FILE]
    dist_suite.py --compare --backend loom --world-size N [...]
    dist_suite.py --control --backend loom --world-size N [...]

--compare runs the whole selection with gloo too. --control (CI's) runs
gloo only on the tests the backend failed, to say of each whether gloo
fails it as well (torch's or the machine's problem): it costs nothing when
all pass. The exit status is the backend's alone either way.

The parent (this process, which never imports torch) runs the tests in a
worker process, one after another; each rank of a test is a fresh process
the suite starts from the worker, forked from a forkserver that imported
torch and the suite once (--start spawn: spawned like upstream, seconds
each). Tests that their own decorators would skip inside the ranks (too few
accelerators or ranks) are reported skipped without starting ranks
(--spawn-gpu-tests starts them). The worker reports each test's
start and end on a pipe; a test that outlives its limit has its worker's
process group killed, counts as failed ("timeout") and the worker starts
again on the tests after it, so a hang fails one test, not the run.

A backend other than gloo/nccl/mpi/ucc is a plugin: the worker and every
rank import --import (loom_torch for loom, which registers "loom") before
the suite is imported, and the name goes into the suite's
DistTestCases.backend_feature["plugin"], as upstream provides for plugins.

Name gates: many tests are skipped when BACKEND is not "gloo" (or not in
the suite's feature sets) by decorators evaluated when the module is
imported. --lift-gates (1) declares the plugin in the feature sets listed in
FEATURES and (2) runs the tests named in LIFTED with the suite imported as
if BACKEND were "gloo" (its decorators see gloo), then points the module's
BACKEND back at the real backend before any test runs, so every process
group is the plugin's. --list reports how many tests are gated that way.

Exit status: 0 when no test failed or errored, 1 otherwise, 2 for a usage
error, 77 when torch, numpy or expecttest is missing (CTest: skipped).

SPDX-License-Identifier: Apache-2.0
"""

import argparse
import importlib
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

SKIP_EXIT = 77
BUILTIN = ("gloo", "nccl", "mpi", "ucc")
# The module the ranks import to register a plugin backend, by backend name.
DEFAULT_IMPORT = {"loom": "loom_torch"}

# Feature sets of DistTestCases.backend_feature that --lift-gates declares
# for a plugin backend, with why it may.
FEATURES = {
    "ddp": "DistributedDataParallel on CPU needs only allreduce/broadcast/allgather, which a backend for CPU tensors has",
    "subgroup": "new_group() creates subgroups through the registered backend's constructor like any other",
}

# Tests torch skips unless BACKEND is "gloo" (or gloo/nccl) although what
# they test goes through the public collective API on CPU tensors only:
# --lift-gates runs them for a plugin with the gates evaluated as gloo's.
# Tests gated for a real reason (gloo's timeouts,
# gloo-specific batch send/recv on CPU, profiler event names) stay gated.
# `dist_suite.py --backend X --list` prints every name-gated test; those not
# here either need accelerators (they skip on CPU for gloo too) or are in
# KEPT_GATED.
_AR_COALESCED = "all_reduce_coalesced on CPU tensors, the public API; gated on the name gloo only"
LIFTED = {
    "test_all_gather_object_default_pg": "all_gather_object pickles into CPU tensors and all_gathers them",
    "test_all_gather_object_subgroup": "all_gather_object on a new_group() subgroup, CPU tensors",
    "test_all_reduce_coalesced_full_group_max": _AR_COALESCED,
    "test_all_reduce_coalesced_full_group_min": _AR_COALESCED,
    "test_all_reduce_coalesced_full_group_product": _AR_COALESCED,
    "test_all_reduce_coalesced_full_group_sum": _AR_COALESCED,
    "test_all_reduce_coalesced_group_max": _AR_COALESCED,
    "test_all_reduce_coalesced_group_min": _AR_COALESCED,
    "test_all_reduce_coalesced_group_product": _AR_COALESCED,
    "test_all_reduce_coalesced_group_sum": _AR_COALESCED,
    "test_all_reduce_coalesced_max": _AR_COALESCED,
    "test_all_reduce_coalesced_min": _AR_COALESCED,
    "test_all_reduce_coalesced_product": _AR_COALESCED,
    "test_all_reduce_coalesced_sum": _AR_COALESCED,
    "test_barrier_timeout_full_group": "a barrier only rank 0 calls fails after the group's timeout: loom honours it",
    "test_barrier_timeout_group": "the same on a subgroup (skipped below 8 ranks, as for gloo)",
    "test_batch_isend_irecv_gloo": "batch_isend_irecv of CPU tensors, one send and one recv per peer pair",
    "test_batch_isend_irecv_gloo_tags": "the same with tags, one message per peer pair (a backend may ignore tags)",
    "test_get_future": "allreduce(...).get_future().then() on CPU tensors: public Work/Future API",
    "test_grads_same_across_ranks_with_no_sync": "DDP no_sync on a CPU model, gradients compared by all_gather",
    "test_scatter_object_list": "scatter_object_list pickles into CPU tensors and scatters/broadcasts them",
    "test_sparse_all_reduce_sum": "all_reduce of sparse COO CPU tensors, SUM: the loom backend implements it as gloo does",
}

# Name-gated tests that stay gated, and why (documentation; not read).
_NO_SYNC = ("_test_accumulate_gradients_no_sync builds its DDP model only when BACKEND is "
            "mpi, gloo or nccl (a check at run time): a plugin gets UnboundLocalError")
KEPT_GATED = {
    "test_accumulate_gradients_no_sync": _NO_SYNC,
    "test_accumulate_gradients_no_sync_allreduce_hook": _NO_SYNC,
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": _NO_SYNC,
    "test_accumulate_gradients_no_sync_grad_is_view": _NO_SYNC,
    "test_monitored_barrier_failure_order": "monitored_barrier() is implemented for gloo only",
    "test_monitored_barrier_gloo": "monitored_barrier() is implemented for gloo only",
    "test_monitored_barrier_gloo_rank_0_timeout": "monitored_barrier() is implemented for gloo only",
    "test_monitored_barrier_gloo_subgroup": "monitored_barrier() is implemented for gloo only",
    "test_monitored_barrier_wait_all_ranks": "monitored_barrier() is implemented for gloo only",
}

# Tests a backend fails on purpose: what they need it does not offer, by a
# decision written down in docs/pytorch.md. Such a test counts as
# "unsupported", not as a failure, only when it failed with the given
# words in its message (anything else still fails); one that passes says so.
_ANY_SOURCE = ("recv without a source rank is not supported",
               "recv from any source: NCCL has none, and Loom does not add one (docs/decisions.md); "
               "torch gates these tests to skip for nccl by name")
_CUSTOM_NAME = ("'custom' != 'loom'",
                "DDP's logging records ProcessGroup::getBackendName(), which torch gives as 'custom' "
                "for every backend registered by a plugin: torch's, not the backend's to change")
UNSUPPORTED = {
    "loom": {
        "test_send_recv_any_source": _ANY_SOURCE,
        "test_send_recv_any_source_autograd_profiler": _ANY_SOURCE,
        "test_send_recv_any_source_torch_profiler": _ANY_SOURCE,
        "test_ddp_logging_data_cpu": _CUSTOM_NAME,
    },
}

_MARK = "=== dist_suite: "


# --------------------------------------------------------------------------
# Worker side: runs in the worker and (re-imported as __mp_main__) in every
# rank the suite spawns; the environment carries what it needs.
# --------------------------------------------------------------------------

def _import_suite(backend, view, features):
    """Imports the suite with its decorators seeing BACKEND=view and the
    plugin declared in `features`; returns the module with BACKEND=backend."""
    import torch
    import torch.distributed as dist  # noqa: F401
    from torch.testing._internal import common_distributed as cd

    if backend not in BUILTIN:
        cd.DistTestCases.backend_feature["plugin"].add(backend)
    for f in features:
        cd.DistTestCases.backend_feature[f].add(backend)
    os.environ["BACKEND"] = view
    import torch.testing._internal.distributed.distributed_test as dt
    os.environ["BACKEND"] = backend
    dt.BACKEND = backend
    torch.backends.cuda.matmul.allow_tf32 = False
    return dt


def _make_class(dt):
    import torch

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

        def _spawn_processes(self):
            if os.environ.get("DIST_SUITE_START", "forkserver") == "spawn":
                return super()._spawn_processes()
            # Like spawn (a fresh process per rank, nothing of the worker's
            # state), but forked from a server that imported torch, the
            # backend and the suite once: a spawned rank spends seconds
            # importing them, more than most tests take. The server's
            # environment is the one it started with, so each rank is
            # handed the worker's environment of the moment (TEMP_DIR,
            # INIT_METHOD and MASTER_PORT change between tests).
            ctx = torch.multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["__main__"])

            def proc(**kw):
                kw["kwargs"] = dict(kw.get("kwargs") or {}, dist_suite_env=dict(os.environ))
                return ctx.Process(**kw)

            self._start_processes(proc)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, dist_suite_env=None, **kwargs):
            if dist_suite_env is not None:
                os.environ.clear()
                os.environ.update(dist_suite_env)
                dt.INIT_METHOD = os.getenv("INIT_METHOD", "env://")
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    # The ranks find the class by this name in their __mp_main__ (this file).
    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    return TestDistBackendWithSpawn


def _worker_env():
    backend = os.environ["DIST_SUITE_BACKEND"]
    view = os.environ.get("DIST_SUITE_VIEW") or backend
    features = [f for f in os.environ.get("DIST_SUITE_FEATURES", "").split(",") if f]
    for mod in [m for m in os.environ.get("DIST_SUITE_IMPORT", "").split(",") if m]:
        importlib.import_module(mod)
    return backend, view, features


if os.environ.get("DIST_SUITE_ROLE") == "worker":
    _B, _V, _F = _worker_env()
    _DT = _import_suite(_B, _V, _F)
    TestDistBackendWithSpawn = _make_class(_DT)


def _test_names(cls):
    return sorted(n for n in dir(cls) if n.startswith("test") and callable(getattr(cls, n)))


def _import_skips(cls):
    return {n: str(getattr(getattr(cls, n), "__unittest_skip_why__", ""))
            for n in _test_names(cls) if getattr(getattr(cls, n), "__unittest_skip__", False)}


def worker_list(out_fd):
    """Names and the import-time skips in each view: 'plain' (torch's view of
    the backend), and for a plugin 'features' (FEATURES declared) and 'gloo'
    (decorators evaluated as gloo's)."""
    backend = _B
    res = {"names": _test_names(TestDistBackendWithSpawn), "skips": {}}
    import torch
    res["torch"] = torch.__version__
    if backend in BUILTIN:
        res["skips"]["plain"] = _import_skips(TestDistBackendWithSpawn)
    else:
        from torch.testing._internal import common_distributed as cd
        dt = _DT
        for view, feats, seen in (("plain", [], backend), ("features", list(FEATURES), backend),
                                  ("gloo", list(FEATURES), "gloo")):
            for f in FEATURES:
                cd.DistTestCases.backend_feature[f].discard(backend)
            for f in feats:
                cd.DistTestCases.backend_feature[f].add(backend)
            os.environ["BACKEND"] = seen
            dt = importlib.reload(dt)
            res["skips"][view] = _import_skips(_make_class(dt))
        os.environ["BACKEND"] = backend
    with os.fdopen(out_fd, "w") as f:
        json.dump(res, f)


def _skip_without_ranks(fn, devices, world_size, backend):
    """Why the test's own decorators will skip it once its ranks have
    started, or None: skip_if_no_gpu and skip_if_lt_x_gpu (without
    allow_cpu) with fewer accelerators than they demand, skip_if_small_worldsize
    and skip_if_odd_worldsize. torch's collection-time resolver reads the
    same decorators (_min_gpus_required) to skip without starting ranks."""
    while fn is not None:
        code = getattr(fn, "__code__", None)
        q = getattr(code, "co_qualname", "")
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ()))) if code else {}
        if q.startswith("skip_if_no_gpu.") and devices < max(1, world_size):
            return "needs %d accelerators, this machine has %d" % (world_size, devices)
        if q.startswith("skip_if_lt_x_gpu.") and not cells.get("allow_cpu", False) \
                and devices < int(cells.get("x", 1)):
            return "needs %d accelerators, this machine has %d" % (int(cells.get("x", 1)), devices)
        if q.startswith("skip_if_small_worldsize.") and backend != "mpi" and world_size < 8:
            return "small world size (skip_if_small_worldsize wants 8 ranks)"
        if q.startswith("skip_if_odd_worldsize.") and backend != "mpi" and world_size % 2 == 1:
            return "odd world size"
        fn = getattr(fn, "__wrapped__", None)
    return None


def worker_run(names, out_fd, timeout):
    import unittest
    import torch
    from torch.testing._internal import common_distributed as cd

    devices = torch.accelerator.device_count() if torch.accelerator.is_available() else 0
    preskip = os.environ.get("DIST_SUITE_PRESKIP", "1") == "1"

    # The suite's own limit per test fires first and reports the ranks'
    # stacks; the parent's watchdog (a little later) is the backstop.
    cd.TIMEOUT_DEFAULT = timeout
    out = os.fdopen(out_fd, "w", buffering=1)
    for name in names:
        out.write(json.dumps({"event": "start", "test": name}) + "\n")
        for stream in (sys.stdout, sys.stderr):
            print(_MARK + "START " + name, file=stream, flush=True)
        t0 = time.monotonic()
        result = unittest.TestResult()
        fn = getattr(TestDistBackendWithSpawn, name)
        why = _skip_without_ranks(fn, devices, int(os.environ["WORLD_SIZE"]), os.environ["BACKEND"])
        if preskip and why and not getattr(fn, "__unittest_skip__", False):
            result.skipped.append((name, why + " (skipped without starting ranks; --spawn-gpu-tests starts them)"))
        else:
            unittest.TestSuite([TestDistBackendWithSpawn(name)]).run(result)
        secs = time.monotonic() - t0
        outcome, reason = "passed", ""
        if result.errors:
            outcome, reason = "errored", result.errors[0][1]
        elif result.failures:
            outcome, reason = "failed", result.failures[0][1]
        elif result.unexpectedSuccesses:
            outcome, reason = "failed", "unexpected success"
        elif result.skipped:
            outcome, reason = "skipped", result.skipped[0][1]
        for stream in (sys.stdout, sys.stderr):
            print(_MARK + "END " + name + " " + outcome, file=stream, flush=True)
        # The words are looked for here, in the whole message: torch joins every
        # failed rank's traceback, and the rank that says why may come first,
        # outside the tail kept below.
        words = UNSUPPORTED.get(os.environ["BACKEND"], {}).get(name, (None, None))[0]
        out.write(json.dumps({"event": "end", "test": name, "outcome": outcome,
                              "seconds": round(secs, 2), "reason": reason[-4000:],
                              "says_unsupported": bool(words and words in reason)}) + "\n")
    out.close()


# --------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------

def _missing_deps():
    for mod in ("torch", "numpy", "expecttest"):
        if importlib.util.find_spec(mod) is None:
            return mod
    return None


class Runner:
    def __init__(self, args, backend):
        self.args = args
        self.backend = backend
        self.plugin = backend not in BUILTIN
        self.imports = args.import_ or DEFAULT_IMPORT.get(backend, "")
        self.tmp = tempfile.mkdtemp(prefix="dist_suite_")
        self.log_path = os.path.join(self.tmp, "worker.log")

    def env(self, view=None, features=()):
        e = dict(os.environ)
        e.update(DIST_SUITE_ROLE="worker", DIST_SUITE_BACKEND=self.backend,
                 DIST_SUITE_VIEW=view or self.backend, DIST_SUITE_FEATURES=",".join(features),
                 DIST_SUITE_IMPORT=self.imports if self.plugin else "",
                 BACKEND=self.backend, WORLD_SIZE=str(self.args.world_size),
                 TEMP_DIR=self.tmp, PYTHONDONTWRITEBYTECODE="1", DIST_SUITE_START=self.args.start,
                 DIST_SUITE_PRESKIP="0" if self.args.spawn_gpu_tests else "1")
        e.setdefault("INIT_METHOD", "env://")
        os.makedirs(os.path.join(self.tmp, "barrier"), exist_ok=True)
        return e

    def _spawn(self, argv, env):
        r, w = os.pipe()
        log = open(self.log_path, "ab")
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv + ["--fd", str(w)],
                             env=env, pass_fds=(w,), stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(w)
        log.close()
        return p, r

    @staticmethod
    def _kill(p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def _log_tail(self, test=None, n=40):
        """The last lines the worker and its ranks wrote (since `test`
        started, when given), without the profiler's trace lines."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 262144))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        if test:
            marks = [i for i, l in enumerate(lines) if l == _MARK + "START " + test]
            lines = lines[marks[-1] + 1:] if marks else lines
        return "\n".join([l for l in lines if not l.startswith("USDT:")][-n:])

    def listing(self):
        p, r = self._spawn(["--worker-list"], self.env(features=list(FEATURES) if self.args.lift_gates else ()))
        with os.fdopen(r) as f:
            data = f.read()
        rc = p.wait()
        if rc != 0 or not data:
            tail = self._log_tail()
            if re.search(r"No module named '(torch|numpy|expecttest)'", tail):
                print(tail + "\ndist_suite: a dependency of the suite is missing: skipped")
                sys.exit(SKIP_EXIT)
            print(tail + "\ndist_suite: importing the suite failed (exit %d)" % rc)
            sys.exit(1)
        return json.loads(data)

    def run_group(self, names, view, features, results):
        """Runs `names` in workers (restarted after a hang or a crash),
        filling results[name]."""
        pending = list(names)
        limit = self.args.timeout
        while pending:
            env = self.env(view, features)
            listfile = os.path.join(self.tmp, "tests.txt")
            with open(listfile, "w") as f:
                f.write("\n".join(pending))
            p, r = self._spawn(["--worker-run", listfile, "--timeout", str(limit)], env)
            current, started, buf, killed = None, time.monotonic(), b"", False
            with os.fdopen(r, "rb", buffering=0) as pipe:
                while True:
                    wait = max(0.1, started + self._limit(current) - time.monotonic()) if current else 600
                    ready, _, _ = select.select([pipe], [], [], min(wait, 5))
                    if ready:
                        chunk = pipe.read(65536)
                        if not chunk:
                            break
                        buf += chunk
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            ev = json.loads(line)
                            if ev["event"] == "start":
                                current, started = ev["test"], time.monotonic()
                            else:
                                results[ev["test"]] = {k: ev[k] for k in ("outcome", "seconds", "reason", "says_unsupported")}
                                pending.remove(ev["test"])
                                self._progress(ev["test"], results[ev["test"]])
                                current, started = None, time.monotonic()
                    elif current is None and time.monotonic() - started > self._limit(None):
                        # No test under way and no word: the worker is stuck
                        # importing or between tests.
                        self._kill(p)
                        for n in pending:
                            results[n] = {"outcome": "errored", "seconds": 0,
                                          "reason": "the worker gave no sign for %ds; killed\n%s"
                                          % (self._limit(None), self._log_tail())}
                            self._progress(n, results[n])
                        return
                    elif current and time.monotonic() - started > self._limit(current):
                        self._kill(p)
                        results[current] = {"outcome": "failed", "seconds": round(time.monotonic() - started, 2),
                                            "reason": "timeout: no result after %ds; killed\n%s"
                                            % (self._limit(current), self._log_tail(current))}
                        pending.remove(current)
                        self._progress(current, results[current])
                        current, killed = None, True
                        break
            rc = p.wait()
            if killed:
                continue
            if current is not None:  # the worker died inside a test
                results[current] = {"outcome": "errored", "seconds": round(time.monotonic() - started, 2),
                                    "reason": "worker exited with status %d\n%s" % (rc, self._log_tail(current))}
                pending.remove(current)
                self._progress(current, results[current])
            elif pending and rc != 0:
                for n in pending:
                    results[n] = {"outcome": "errored", "seconds": 0,
                                  "reason": "worker exited with status %d before the test\n%s" % (rc, self._log_tail())}
                print(self._log_tail())
                return

    def _limit(self, name):
        # The suite's own longer limits for two DDP tests, then a margin for
        # its teardown after its own timeout.
        extra = {"test_ddp_uneven_inputs": 400, "test_DistributedDataParallel": 500}
        return max(self.args.timeout, extra.get(name, 0)) + 30

    def _progress(self, name, res):
        if self.args.verbose or res["outcome"] in ("failed", "errored"):
            print("%-8s %6.1fs %s" % (res["outcome"], res["seconds"], name), flush=True)


def select_tests(names, args):
    if args.k:
        names = [n for n in names if re.search(args.k, n)]
    if args.chunk:
        k, m = args.chunk
        # Round robin over the sorted names: neighbours (test_ddp_*) are alike
        # in cost, so each chunk gets a share of every kind.
        names = [n for i, n in enumerate(names) if i % m == k - 1]
    return names


def gate_report(lst, backend):
    s = lst["skips"]
    if "gloo" not in s:
        return {"gated_total": 0, "feature_gated": [], "name_gated": [], "lifted": [], "still_gated": []}
    plain, feats, gloo = set(s["plain"]), set(s["features"]), set(s["gloo"])
    name_gated = sorted(feats - gloo)
    return {"gated_total": len(plain - gloo),
            "feature_gated": sorted(plain - feats),
            "name_gated": name_gated,
            "lifted": sorted(n for n in name_gated if n in LIFTED),
            "still_gated": sorted(n for n in name_gated if n not in LIFTED),
            "reasons": {n: s["features"][n] for n in name_gated}}


def run_suite(args, backend):
    """Runs the selection for one backend; returns the result document."""
    t0 = time.monotonic()
    runner = Runner(args, backend)
    lst = runner.listing()
    gates = gate_report(lst, backend)
    names = select_tests(lst["names"], args)
    lifted = set(gates["lifted"]) if (args.lift_gates and runner.plugin) else set()
    features = list(FEATURES) if (args.lift_gates and runner.plugin) else []
    results = {}
    native = [n for n in names if n not in lifted]
    runner.run_group(native, None, features, results)
    if lifted & set(names):
        runner.run_group([n for n in names if n in lifted], "gloo", features, results)
    for n in names:
        if n in lifted:
            results[n]["lifted"] = True
        words, why = UNSUPPORTED.get(backend, {}).get(n, (None, None))
        r = results[n]
        if words and r["outcome"] in ("failed", "errored") and r.get("says_unsupported"):
            r["outcome"], r["unsupported"] = "unsupported", why
        elif words and r["outcome"] == "passed":
            r["note"] = "listed in UNSUPPORTED but passed: take it out of the list"
    counts = {o: 0 for o in ("passed", "failed", "errored", "skipped", "unsupported")}
    for r in results.values():
        counts[r["outcome"]] += 1
    doc = {"backend": backend, "world_size": args.world_size, "torch": lst.get("torch"),
           "chunk": "%d/%d" % args.chunk if args.chunk else None, "filter": args.k,
           "lift_gates": bool(args.lift_gates), "seconds": round(time.monotonic() - t0, 1),
           "counts": counts, "gates": {k: v for k, v in gates.items() if k != "reasons"},
           "tests": {n: results[n] for n in names}}
    import shutil
    if args.log:
        shutil.copyfile(runner.log_path, args.log if not args.compare else "%s.%s" % (args.log, backend))
    shutil.rmtree(runner.tmp, ignore_errors=True)
    return doc


def print_summary(doc):
    c = doc["counts"]
    print("\n%s, %d ranks%s: %d tests in %.0fs: %d passed, %d failed, %d errored, %d skipped, %d unsupported"
          % (doc["backend"], doc["world_size"], " (chunk %s)" % doc["chunk"] if doc["chunk"] else "",
             len(doc["tests"]), doc["seconds"], c["passed"], c["failed"], c["errored"], c["skipped"],
             c["unsupported"]))
    for n, r in sorted(doc["tests"].items()):
        if r["outcome"] == "unsupported":
            print("unsupported: %s (%s)" % (n, r["unsupported"]))
        if r.get("note"):
            print("note: %s %s" % (n, r["note"]))
    g = doc["gates"]
    if g["gated_total"]:
        print("gated by backend name/feature at import: %d (%d by feature set, %d by name; "
              "%d of those in LIFTED)%s" % (g["gated_total"], len(g["feature_gated"]), len(g["name_gated"]),
                                           len(g["lifted"]), " — lifted" if doc["lift_gates"] else ""))
    bad = sorted(n for n, r in doc["tests"].items() if r["outcome"] in ("failed", "errored"))
    for n in bad:
        r = doc["tests"][n]
        print("\n--- %s %s (%.1fs)" % (r["outcome"].upper(), n, r["seconds"]))
        print("\n".join(r["reason"].strip().splitlines()[-15:]))
    if bad:
        print("\nfailing: " + " ".join(bad))


def print_compare(ref, other):
    print("\n%-10s %10s %10s" % ("", ref["backend"], other["backend"]))
    for k in ("passed", "failed", "errored", "skipped", "unsupported"):
        print("%-11s %10d %10d" % (k, ref["counts"].get(k, 0), other["counts"].get(k, 0)))
    print("%-10s %9.0fs %9.0fs" % ("time", ref["seconds"], other["seconds"]))
    lost = sorted(n for n, r in ref["tests"].items() if r["outcome"] == "passed"
                  and other["tests"].get(n, {}).get("outcome") in ("failed", "errored"))
    skipped = sorted(n for n, r in ref["tests"].items() if r["outcome"] == "passed"
                     and other["tests"].get(n, {}).get("outcome") == "skipped")
    gained = sorted(n for n, r in other["tests"].items() if r["outcome"] == "passed"
                    and ref["tests"].get(n, {}).get("outcome") != "passed")
    print("\n%s passes, %s fails (%d):" % (ref["backend"], other["backend"], len(lost)))
    for n in lost:
        print("  %-60s %s" % (n, other["tests"][n]["outcome"]))
    print("\n%s passes, %s skips (%d): %s" % (ref["backend"], other["backend"], len(skipped), " ".join(skipped)))
    unsup = sorted(n for n, r in other["tests"].items() if r["outcome"] == "unsupported")
    print("\n%s does not support, by decision (%d): %s" % (other["backend"], len(unsup), " ".join(unsup)))
    if gained:
        print("\n%s passes, %s does not: %s" % (other["backend"], ref["backend"], " ".join(gained)))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--chunk", help="K/M: the K-th of M chunks (1-based)")
    ap.add_argument("--list", action="store_true", help="list the selected tests and the gated ones; run nothing")
    ap.add_argument("-k", help="regex: only the tests whose name it matches")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test (default 120)")
    ap.add_argument("--lift-gates", action="store_true")
    ap.add_argument("--import", dest="import_", help="module(s) the ranks import to register a plugin backend")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--spawn-gpu-tests", action="store_true",
                    help="start the ranks of tests whose decorators will skip them (too few accelerators "
                         "or ranks), as upstream does (they skip after seconds each)")
    ap.add_argument("--log", help="keep the output of the tests and their ranks in this file")
    ap.add_argument("--start", choices=("forkserver", "spawn"), default="forkserver",
                    help="how ranks start: forked from a server that imported the suite once "
                         "(default), or spawned like upstream (seconds per rank)")
    ap.add_argument("--compare", action="store_true", help="run gloo too and compare")
    ap.add_argument("--control", action="store_true",
                    help="run gloo on the tests the backend failed, and say which gloo fails too")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per test")
    ap.add_argument("--worker-list", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-run", help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.chunk:
        m = re.fullmatch(r"(\d+)/(\d+)", args.chunk)
        if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
            ap.error("--chunk wants K/M with 1 <= K <= M")
        args.chunk = (int(m.group(1)), int(m.group(2)))
    if args.world_size < 2:
        ap.error("--world-size must be at least 2")
    return args


def main(argv):
    args = parse_args(argv)
    if args.worker_list:
        worker_list(args.fd)
        return 0
    if args.worker_run:
        with open(args.worker_run) as f:
            worker_run([n for n in f.read().split("\n") if n], args.fd, args.timeout)
        return 0

    missing = _missing_deps()
    if missing:
        print("dist_suite: %s is not importable by %s: skipped" % (missing, sys.executable))
        return SKIP_EXIT

    if args.list:
        runner = Runner(args, args.backend)
        lst = runner.listing()
        names = select_tests(lst["names"], args)
        skips = lst["skips"]["features" if (args.lift_gates and runner.plugin) else "plain"]
        for n in names:
            print(n + ("   [skipped: %s]" % skips[n] if n in skips else ""))
        g = gate_report(lst, args.backend)
        print("\n%d tests selected of %d; %d skipped at import for %s" % (len(names), len(lst["names"]), len([n for n in names if n in skips]), args.backend))
        if g["gated_total"]:
            print("gated for %s but not for gloo: %d; by feature set (%s): %d; by name: %d, of which in LIFTED: %d"
                  % (args.backend, g["gated_total"], ",".join(FEATURES), len(g["feature_gated"]),
                     len(g["name_gated"]), len(g["lifted"])))
            for n in g["name_gated"]:
                print("  %s %-55s %s" % ("lifted" if n in LIFTED else "gated ", n, g["reasons"][n]))
        return 0

    if args.compare:
        ref = run_suite(args, "gloo")
        print_summary(ref)
        other = run_suite(args, args.backend)
        print_summary(other)
        print_compare(ref, other)
        docs = {"gloo": ref, args.backend: other}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(docs, f, indent=1)
        return 0 if not (other["counts"]["failed"] or other["counts"]["errored"]) else 1

    doc = run_suite(args, args.backend)
    print_summary(doc)
    bad = sorted(n for n, r in doc["tests"].items() if r["outcome"] in ("failed", "errored"))
    if args.control and bad:
        args.k, args.chunk = "^(%s)$" % "|".join(re.escape(n) for n in bad), None
        ref = run_suite(args, "gloo")
        print("\ncontrol, gloo on the %d test(s) %s failed:" % (len(bad), args.backend))
        for n in bad:
            print("  %-60s gloo %s" % (n, ref["tests"].get(n, {}).get("outcome", "not run")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if not (doc["counts"]["failed"] or doc["counts"]["errored"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
