/*
 * Flat AllReduce in place in the ranks' buffers (src/exec/flat.c) where
 * they lie in windows every rank maps: ncclMemAlloc's memory registered
 * with ncclCommWindowRegister. Symmetric windows choose Flat without
 * NCCL_ALGO at every size; each rank's log must say that it read and
 * wrote the others' buffers in place, so a silent fall back to copies
 * fails. Every placement is checked: out of place and in place, buffers
 * at offsets in their windows, several rounds of the arena, ranks whose
 * buffers are plain memory beside ranks whose are in windows, PreMulSum
 * (whose input each rank scales itself), ranks as threads; and ranks that
 * choose differently for one call are told so at once.
 */
#include <stdint.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

static void win_log(void) { harness_rank_log("flatwin", "SHM,TUNING"); }

/* 3 ranks: the arena's region is 1 MiB, so this many floats take three
 * rounds, the last one short and not a multiple of a cache line. */
#define BIG 700001

/* Rank r's element i: small integers, so that every sum is exact. */
static float value(int r, size_t i) { return (float)((r + 1) * (int)(i % 13) + (int)(i % 7)); }

struct layout {
  int sym;          /* NCCL_WIN_COLL_SYMMETRIC */
  int plain_rank;   /* this rank passes plain memory; -1: none */
  int plain_send;   /* only the send buffer is plain memory, on every rank */
  int threads;      /* ranks as threads: one log for all, not read */
  int plain_all;    /* every rank passes plain memory */
  int group_rank;   /* this rank makes the call in a group of its own (plans it afresh); 0: none */
};

struct bufs {
  char *win[2];
  ncclWindow_t w[2];
  float *plain[2];
};

static int bufs_make(ncclComm_t comm, int rank, const struct layout *L, struct bufs *b) {
  size_t bytes = (size_t)BIG * sizeof(float) + 8192;
  memset(b, 0, sizeof *b);
  for (int k = 0; k < 2; k++) {
    RCHECK(comm, ncclMemAlloc((void **)&b->win[k], bytes));
    RCHECK(comm, ncclCommWindowRegister(comm, b->win[k], bytes, &b->w[k], L->sym ? NCCL_WIN_COLL_SYMMETRIC : 0));
    b->plain[k] = malloc(bytes);
    RASSERT(b->plain[k] != NULL, "rank %d: out of memory", rank);
  }
  return 0;
}

static int bufs_free(ncclComm_t comm, struct bufs *b) {
  for (int k = 0; k < 2; k++) {
    RCHECK(comm, ncclCommWindowDeregister(comm, b->w[k]));
    RCHECK(comm, ncclMemFree(b->win[k]));
    free(b->plain[k]);
  }
  return 0;
}

/* One call and its check. In place uses the receive window. */
static int one_call(ncclComm_t comm, int rank, int n, const struct layout *L, struct bufs *b, size_t count,
                    int in_place, ncclRedOp_t op, int premul) {
  int plain = L->plain_all || L->plain_rank == rank;
  /* Offsets that are not the windows' starts, and differ between the
   * two buffers, so that nobody assumes a window's first byte. */
  float *send = plain ? b->plain[0] : (float *)(b->win[0] + 4096 + 4);
  float *recv = plain ? b->plain[1] : (float *)(b->win[1] + 128);
  if (L->plain_send)
    send = b->plain[0];
  if (in_place)
    send = recv;
  for (size_t i = 0; i < count; i++)
    send[i] = value(rank, i);
  recv[count] = -7.0f; /* just past the output: must stay */
  ncclRedOp_t use = op;
  if (premul) {
    float scale = (float)(rank + 1);
    RCHECK(comm, ncclRedOpCreatePreMulSum(&use, &scale, ncclFloat, ncclScalarHostImmediate, comm));
  }
  int group = L->group_rank != 0 && L->group_rank == rank;
  if (group)
    RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclAllReduce(send, recv, count, ncclFloat, use, comm, NULL));
  if (group)
    RCHECK(comm, ncclGroupEnd());
  if (premul)
    RCHECK(comm, ncclRedOpDestroy(use, comm));
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < n; r++) {
      float v = value(r, i) * (premul ? (float)(r + 1) : 1.0f);
      want = op == ncclMax ? (r == 0 || v > want ? v : want) : want + v;
    }
    RASSERT(recv[i] == want, "rank %d: count %zu%s op %d%s: element %zu is %g, not %g", rank, count,
            in_place ? " in place" : "", (int)op, premul ? " (PreMulSum)" : "", i, recv[i], want);
  }
  RASSERT(recv[count] == -7.0f, "rank %d: count %zu: the element past the output became %g", rank, count,
          recv[count]);
  return 0;
}

static int calls_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct layout *L = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  struct bufs b;
  if (bufs_make(comm, rank, L, &b))
    return 1;
  static const size_t counts[] = {1000, 5000, 70001, BIG};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
    for (int in_place = 0; in_place < 2; in_place++) {
      if (one_call(comm, rank, n, L, &b, counts[c], in_place, ncclSum, 0) ||
          one_call(comm, rank, n, L, &b, counts[c], in_place, ncclMax, 0))
        return 1;
    }
  if (one_call(comm, rank, n, L, &b, BIG, 0, ncclSum, 1) || one_call(comm, rank, n, L, &b, 5000, 1, ncclSum, 1))
    return 1;
  if (bufs_free(comm, &b))
    return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  if (L->threads)
    return 0;
  int direct = harness_rank_log_count("flatwin", "buffers in place, in windows");
  int flat = harness_rank_log_count("flatwin", ": Flat,");
  harness_rank_log_remove("flatwin");
  RASSERT(direct == 1, "rank %d: the log says %d time(s) that flat calls used the windows in place", rank, direct);
  RASSERT(flat >= 3, "rank %d: the tuner's log names Flat for %d size classes", rank, flat);
  return 0;
}

/* Symmetric windows: Flat without NCCL_ALGO, at 2 ranks too, where the
 * tuner would otherwise pick rings for all but the smallest calls. */
TEST_IMPL(flat_win_sym_2) {
  static struct layout L = {.sym = 1, .plain_rank = -1};
  win_log();
  return run_ranks(2, calls_rank, &L);
}

TEST_IMPL(flat_win_sym_3) {
  static struct layout L = {.sym = 1, .plain_rank = -1};
  win_log();
  return run_ranks(3, calls_rank, &L);
}

/* Rank 1's buffers are plain memory: it copies through its regions and
 * gathers from the others', while they read and write each other's in
 * place and write their results into their regions for it. Windows
 * without the symmetric flag, and Flat named in NCCL_ALGO. */
TEST_IMPL(flat_win_mixed) {
  static struct layout L = {.sym = 0, .plain_rank = 1};
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  win_log();
  return run_ranks(3, calls_rank, &L);
}

/* Every rank's output in a window, its input plain. */
TEST_IMPL(flat_win_plain_send) {
  static struct layout L = {.sym = 0, .plain_rank = -1, .plain_send = 1};
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  win_log();
  return run_ranks(3, calls_rank, &L);
}

/* Ranks as threads of one process reach each other's windows by their
 * pointers. */
TEST_IMPL(flat_win_threads) {
  static struct layout L = {.sym = 1, .plain_rank = -1, .threads = 1};
  return run_rank_threads(4, calls_rank, &L);
}

/* Rank 0's buffers are in its symmetric window, rank 1's are not: rank 0
 * runs the call flat, rank 1 over its connections (where each rank has a
 * CPU, the tuner picks rings at this size for buffers outside symmetric
 * windows). Both are told, from the arena's header, well before
 * LOOM_TIMEOUT, and nothing is reduced into the outputs. */
static int crossed_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  enum { COUNT = 5 << 20 };
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  size_t bytes = COUNT * sizeof(float);
  char *win;
  ncclWindow_t w;
  RCHECK(comm, ncclMemAlloc((void **)&win, bytes));
  RCHECK(comm, ncclCommWindowRegister(comm, win, bytes, &w, NCCL_WIN_COLL_SYMMETRIC));
  float *buf = rank == 0 ? (float *)win : malloc(bytes);
  RASSERT(buf != NULL, "rank %d: out of memory", rank);
  for (int i = 0; i < COUNT; i++)
    buf[i] = 1.0f;
  double t0 = now_s();
  ncclResult_t r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  double took = now_s() - t0;
  const char *msg = ncclGetLastError(comm);
  fprintf(stderr, "rank %d: %s: %s\n", rank, ncclGetErrorString(r), msg);
  RASSERT(r == ncclInvalidUsage || r == ncclRemoteError, "rank %d: the crossed call returned %d", rank, (int)r);
  RASSERT(took < 5, "rank %d took %.1f s to name the crossing", rank, took);
  RASSERT(strstr(msg, "NCCL_WIN_COLL_SYMMETRIC") != NULL, "rank %d: the message does not say why: %s", rank, msg);
  for (int i = 0; i < COUNT; i++)
    RASSERT(buf[i] == 1.0f, "rank %d: element %d became %g", rank, i, buf[i]);
  ncclCommAbort(comm);
  return 0;
}

TEST_IMPL(flat_win_crossed) {
  /* Where ranks outnumber CPUs every AllReduce runs Flat, whatever its
   * buffers: the ranks cannot choose differently. */
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < 2)
    SKIP("one CPU: 2 ranks outnumber it, so both run every AllReduce Flat and cannot cross");
  setenv("LOOM_TIMEOUT", "20", 1);
  return run_ranks(2, crossed_rank, NULL);
}

/* Pinned 4 ranks: calls by CPU while no window is registered, and by
 * slices in symmetric windows between registering and deregistering
 * them, one after another. A round by CPU must not write where a slower
 * rank still reads the last round by slices, nor the other way round.
 * The calls in windows are PreMulSums every other time, whose inputs
 * each rank scales into its region, so that the regions are in use by
 * slices too. With windows registered, a call in plain memory of the
 * shape just made by CPU goes by slices too, whether a rank takes its
 * work back (enqueue_single) or, as rank 2 does in a group, plans it
 * afresh. */
static int alternate_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  static struct layout sym = {.sym = 1, .plain_rank = -1}, plain = {.sym = 1, .plain_rank = -1, .plain_all = 1},
                       plain_group = {.sym = 1, .plain_rank = -1, .plain_all = 1, .group_rank = 2};
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  size_t bytes = (size_t)BIG * sizeof(float) + 8192;
  struct bufs b;
  memset(&b, 0, sizeof b);
  for (int k = 0; k < 2; k++) {
    RCHECK(comm, ncclMemAlloc((void **)&b.win[k], bytes));
    b.plain[k] = malloc(bytes);
    RASSERT(b.plain[k] != NULL, "rank %d: out of memory", rank);
  }
  for (int k = 0; k < 12; k++) {
    size_t count = k % 4 < 2 ? BIG : 70001;
    if (one_call(comm, rank, n, &plain, &b, count, k % 3 == 0, ncclSum, 0))
      return 1;
    for (int j = 0; j < 2; j++)
      RCHECK(comm, ncclCommWindowRegister(comm, b.win[j], bytes, &b.w[j], NCCL_WIN_COLL_SYMMETRIC));
    if (one_call(comm, rank, n, &plain_group, &b, count, k % 3 == 0, ncclSum, 0) ||
        one_call(comm, rank, n, &sym, &b, k % 3 == 1 ? 70001 : BIG, k % 2 == 0, ncclSum, k % 2))
      return 1;
    for (int j = 0; j < 2; j++)
      RCHECK(comm, ncclCommWindowDeregister(comm, b.w[j]));
  }
  for (int k = 0; k < 2; k++) {
    RCHECK(comm, ncclMemFree(b.win[k]));
    free(b.plain[k]);
  }
  RCHECK(comm, ncclCommDestroy(comm));
  int cpu = harness_rank_log_count("flatwin", "go by CPU"), direct = harness_rank_log_count("flatwin", "in windows");
  harness_rank_log_remove("flatwin");
  RASSERT(cpu == 1 && direct == 1, "rank %d: the log says by CPU %d time(s), in windows %d time(s), not once each",
          rank, cpu, direct);
  return 0;
}

TEST_IMPL(flat_cpu_win_alternate) {
  win_log();
  harness_set_rank_setup(harness_pin_setup);
  return run_ranks(4, alternate_rank, NULL);
}
