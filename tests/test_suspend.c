/*
 * ncclCommSuspend, ncclCommResume and ncclCommMemStats: suspending frees
 * the connections (their shared memory and sockets go), every
 * call but resume, the statistics, the queries, destroy and abort is
 * refused with a sentence, and after resuming collectives and send/recv
 * give right results again over the same transports; the statistics keep
 * the suspended bytes and say whether they are released, as NCCL's do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_test.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

#define COUNT (1 << 18) /* several FIFO slots' worth */

static int refused_suspended(ncclComm_t comm, ncclResult_t r, const char *call) {
  RASSERT(r == ncclInvalidUsage, "%s on a suspended communicator returned %d", call, (int)r);
  RASSERT(strstr(ncclGetLastError(comm), "suspended; call ncclCommResume") != NULL, "%s: %s", call,
          ncclGetLastError(comm));
  return 0;
}

/* AllReduce (rank r gives r + 1 + i) and a ring of send/recv (each rank
 * sends its rank + i to the next), checked. */
static int calls_work(ncclComm_t comm, int rank, int n, size_t count) {
  float *d = tbuf_alloc(comm, count * sizeof(float)), *h = malloc(count * sizeof(float));
  float *s = tbuf_alloc(comm, count * sizeof(float)), *r = tbuf_alloc(comm, count * sizeof(float));
  RASSERT(d && h && s && r, "out of memory");
  for (size_t i = 0; i < count; i++)
    h[i] = (float)(rank + 1 + (int)(i % 7));
  RASSERT(tbuf_put(comm, d, h, count * sizeof(float)) == 0, "copy in");
  RCHECK(comm, tbuf_result(comm, ncclAllReduce(d, d, count, ncclFloat, ncclSum, comm, NULL)));
  RASSERT(tbuf_get(comm, h, d, count * sizeof(float)) == 0, "copy out");
  for (size_t i = 0; i < count; i++)
    RASSERT(h[i] == (float)(n * (n + 1) / 2 + n * (int)(i % 7)), "AllReduce element %zu is %g", i, h[i]);
  for (size_t i = 0; i < count; i++)
    h[i] = (float)(rank * 1000 + (int)(i % 11));
  RASSERT(tbuf_put(comm, s, h, count * sizeof(float)) == 0, "copy in");
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclSend(s, count, ncclFloat, next, comm, NULL));
  RCHECK(comm, ncclRecv(r, count, ncclFloat, prev, comm, NULL));
  RCHECK(comm, tbuf_result(comm, ncclGroupEnd()));
  RASSERT(tbuf_get(comm, h, r, count * sizeof(float)) == 0, "copy out");
  for (size_t i = 0; i < count; i++)
    RASSERT(h[i] == (float)(prev * 1000 + (int)(i % 11)), "received element %zu is %g", i, h[i]);
  tbuf_free(d);
  tbuf_free(s);
  tbuf_free(r);
  free(h);
  return 0;
}

struct stats {
  uint64_t suspend, suspended, persist, total;
};

static int read_stats(ncclComm_t comm, struct stats *st) {
  RCHECK(comm, ncclCommMemStats(comm, ncclStatGpuMemSuspend, &st->suspend));
  RCHECK(comm, ncclCommMemStats(comm, ncclStatGpuMemSuspended, &st->suspended));
  RCHECK(comm, ncclCommMemStats(comm, ncclStatGpuMemPersist, &st->persist));
  RCHECK(comm, ncclCommMemStats(comm, ncclStatGpuMemTotal, &st->total));
  RASSERT(st->total == st->suspend + st->persist, "total %llu is not suspend %llu + persist %llu",
          (unsigned long long)st->total, (unsigned long long)st->suspend, (unsigned long long)st->persist);
  return 0;
}

/* The statistics report the bytes of `before` (suspended or not: NCCL
 * keeps the released bytes counted), with the flag `suspended`. */
static int same_bytes(ncclComm_t comm, const struct stats *before, uint64_t suspended) {
  struct stats now;
  if (read_stats(comm, &now))
    return 1;
  RASSERT(now.suspended == suspended && now.suspend == before->suspend && now.total == before->total,
          "suspend %llu (before %llu), suspended %llu (want %llu)", (unsigned long long)now.suspend,
          (unsigned long long)before->suspend, (unsigned long long)now.suspended, (unsigned long long)suspended);
  return 0;
}

struct variant {
  const char *transport; /* what loomCommPeerTransport must say */
  int host;
};

static int suspend_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct variant *v = arg;
  int shm0 = harness_shm_segments();
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  /* A host communicator connects at its first call: its bootstrap
   * sockets and the peers' pidfds are all it has now. */
  int fds_init = harness_count_entries("/proc/self/fd", NULL);
  int next = (rank + 1) % n;
  if (calls_work(comm, rank, n, COUNT))
    return 1;
  int fds_conn = harness_count_entries("/proc/self/fd", NULL);
  const char *tr = NULL;
  RCHECK(comm, loomCommPeerTransport(comm, next, &tr));
  RASSERT(strcmp(tr, v->transport) == 0, "rank %d reaches rank %d over %s, not %s", rank, next, tr, v->transport);
  struct stats before;
  if (read_stats(comm, &before))
    return 1;
  RASSERT(before.suspend > 0 && before.suspended == 0 && before.persist == 0, "before: suspend %llu suspended %llu",
          (unsigned long long)before.suspend, (unsigned long long)before.suspended);
  if (v->host && strcmp(v->transport, "shm") == 0)
    RASSERT(harness_shm_segments() > shm0, "no shared memory mapped after the calls");
  if (v->host && strcmp(v->transport, "net/socket") == 0)
    RASSERT(fds_conn > fds_init, "no sockets opened by the calls (%d file descriptors)", fds_conn);

  for (int round = 0; round < 2; round++) {
    RCHECK(comm, ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
    if (same_bytes(comm, &before, 1))
      return 1;
    RCHECK(comm, loomCommPeerTransport(comm, next, &tr));
    RASSERT(strcmp(tr, "none") == 0, "rank %d still has a connection to rank %d (%s) while suspended", rank, next,
            tr);
    if (v->host) {
      /* What the connections held is gone: shared memory, sockets. */
      int shm1 = harness_shm_segments(), fds1 = harness_count_entries("/proc/self/fd", NULL);
      RASSERT(shm1 == shm0, "%d shared-memory segments before the communicator, %d while suspended", shm0, shm1);
      RASSERT(fds1 == fds_init, "%d file descriptors after init, %d connected, %d while suspended", fds_init,
              fds_conn, fds1);
    }
    float x[4] = {0};
    ncclComm_t other = NULL;
    void *handle = NULL;
    if (refused_suspended(comm, ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, NULL), "ncclAllReduce") ||
        refused_suspended(comm, ncclSend(x, 1, ncclFloat, next, comm, NULL), "ncclSend") ||
        refused_suspended(comm, ncclRecv(x, 1, ncclFloat, next, comm, NULL), "ncclRecv") ||
        refused_suspended(comm, ncclCommSplit(comm, 0, rank, &other, NULL), "ncclCommSplit") ||
        refused_suspended(comm, ncclCommShrink(comm, NULL, 0, &other, NULL, NCCL_SHRINK_DEFAULT), "ncclCommShrink") ||
        refused_suspended(comm, ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), "ncclCommRevoke") ||
        refused_suspended(comm, ncclCommRegister(comm, x, sizeof x, &handle), "ncclCommRegister") ||
        refused_suspended(comm, ncclCommFinalize(comm), "ncclCommFinalize"))
      return 1;
    RASSERT(other == NULL, "a communicator was made from a suspended one");
    /* Inside a group too, where ncclGroupEnd then reports it. */
    RCHECK(comm, ncclGroupStart());
    ncclResult_t r = ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, NULL);
    ncclResult_t end = ncclGroupEnd();
    if (refused_suspended(comm, r, "ncclAllReduce in a group"))
      return 1;
    RASSERT(end != ncclSuccess, "the group with a refused call succeeded");
    /* The queries answer. */
    int count = 0, me = -1, dev = -2;
    ncclResult_t async = ncclInternalError;
    RCHECK(comm, ncclCommCount(comm, &count));
    RCHECK(comm, ncclCommUserRank(comm, &me));
    RCHECK(comm, ncclCommCuDevice(comm, &dev));
    RCHECK(comm, ncclCommGetAsyncError(comm, &async));
    RASSERT(count == n && me == rank && async == ncclSuccess, "queries: %d %d %d", count, me, (int)async);
    r = ncclCommSuspend(comm, NCCL_SUSPEND_MEM);
    RASSERT(r == ncclInvalidUsage && strstr(ncclGetLastError(comm), "suspended already"), "suspend twice: %d: %s",
            (int)r, ncclGetLastError(comm));

    RCHECK(comm, ncclCommResume(comm));
    if (same_bytes(comm, &before, 0))
      return 1;
    RCHECK(comm, loomCommPeerTransport(comm, next, &tr));
    RASSERT(strcmp(tr, v->transport) == 0, "after resuming, rank %d reaches rank %d over %s, not %s", rank, next, tr,
            v->transport);
    if (calls_work(comm, rank, n, round ? 1000 : COUNT) || calls_work(comm, rank, n, 3))
      return 1;
  }
  ncclResult_t r = ncclCommResume(comm);
  RASSERT(r == ncclInvalidUsage && strstr(ncclGetLastError(comm), "not suspended"), "resume unsuspended: %d: %s",
          (int)r, ncclGetLastError(comm));
  /* A suspended communicator is destroyed like any other. */
  RCHECK(comm, ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(suspend_shm_3) {
  setenv("LOOM_DEVICE", "host", 1);
  struct variant v = {"shm", 1};
  return run_ranks(3, suspend_rank, &v);
}

TEST_IMPL(suspend_socket_3) {
  setenv("LOOM_DEVICE", "host", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  struct variant v = {"net/socket", 1};
  return run_ranks(3, suspend_rank, &v);
}

/* One thread driving every rank suspends and resumes them in a group,
 * where each runs on a thread of its own at ncclGroupEnd; calls queued
 * after a suspend in the same group are refused. */
TEST_IMPL(suspend_group) {
  setenv("LOOM_DEVICE", "host", 1);
  enum { N = 3 };
  ncclComm_t comms[N];
  ASSERT_OK(ncclCommInitAll(comms, N, NULL));
  float x[N][64];
  for (int round = 0; round < 2; round++) {
    for (int r = 0; r < N; r++)
      for (int i = 0; i < 64; i++)
        x[r][i] = (float)(r + i);
    ASSERT_OK(ncclGroupStart());
    for (int r = 0; r < N; r++)
      ASSERT_OK(ncclAllReduce(x[r], x[r], 64, ncclFloat, ncclSum, comms[r], NULL));
    ASSERT_OK(ncclGroupEnd());
    for (int r = 0; r < N; r++)
      for (int i = 0; i < 64; i++)
        ASSERT_MSG(x[r][i] == (float)(3 + 3 * i), "round %d rank %d element %d is %g", round, r, i, x[r][i]);
    uint64_t before = 0, v = 0;
    ASSERT_OK(ncclCommMemStats(comms[0], ncclStatGpuMemSuspend, &before));
    ASSERT(before > 0);
    ASSERT_OK(ncclGroupStart());
    for (int r = 0; r < N; r++)
      ASSERT_OK(ncclCommSuspend(comms[r], NCCL_SUSPEND_MEM));
    ASSERT(ncclAllReduce(x[0], x[0], 64, ncclFloat, ncclSum, comms[0], NULL) == ncclInvalidUsage);
    ASSERT(strstr(ncclGetLastError(comms[0]), "suspended at the end of this group"));
    ASSERT(ncclCommSuspend(comms[1], NCCL_SUSPEND_MEM) == ncclInvalidUsage);
    ASSERT(strstr(ncclGetLastError(comms[1]), "already queued"));
    ASSERT(ncclCommDestroy(comms[2]) == ncclInvalidUsage);
    ASSERT(strstr(ncclGetLastError(NULL), "ncclCommSuspend queued in an open group"));
    ASSERT(ncclGroupEnd() != ncclSuccess); /* the refused AllReduce */
    for (int r = 0; r < N; r++) {
      ASSERT_OK(ncclCommMemStats(comms[r], ncclStatGpuMemSuspended, &v));
      ASSERT_MSG(v == 1, "rank %d is not suspended", r);
    }
    ASSERT_OK(ncclGroupStart());
    for (int r = 0; r < N; r++)
      ASSERT_OK(ncclCommResume(comms[r]));
    ASSERT_OK(ncclGroupEnd());
    ASSERT_OK(ncclCommMemStats(comms[0], ncclStatGpuMemSuspend, &v));
    ASSERT(v == before);
    ASSERT_OK(ncclCommMemStats(comms[0], ncclStatGpuMemSuspended, &v));
    ASSERT(v == 0);
  }
  for (int r = 0; r < N; r++)
    ASSERT_OK(ncclCommDestroy(comms[r]));
  return 0;
}

/* A nonblocking communicator's AllReduce still in flight (rank 1 joins
 * only once rank 0 has tried): rank 0's suspend is refused, since waiting
 * for a call its peer has not made could be forever; once the AllReduce
 * ends, both ranks suspend and resume, and the next AllReduce is right. */
static int wait_done(ncclComm_t comm, ncclResult_t r) {
  RASSERT(r == ncclSuccess || r == ncclInProgress, "returned %d: %s", (int)r, ncclGetLastError(comm));
  ncclResult_t st = ncclInProgress;
  for (double t0 = now_s(); st == ncclInProgress && now_s() - t0 < 30;)
    RCHECK(comm, ncclCommGetAsyncError(comm, &st));
  RASSERT(st == ncclSuccess, "ended as %d: %s", (int)st, ncclGetLastError(comm));
  return 0;
}

static int busy_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int *go = arg; /* a pipe: rank 0 writes once it has tried */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm;
  ncclResult_t init = ncclCommInitRankConfig(&comm, n, id, rank, &config);
  RASSERT(init == ncclSuccess || init == ncclInProgress, "init returned %d", (int)init);
  if (wait_done(comm, init))
    return 1;
  static float x[1 << 12];
  for (int i = 0; i < 1 << 12; i++)
    x[i] = (float)(rank + 1);
  if (rank == 0) {
    close(go[0]);
    RASSERT(ncclAllReduce(x, x, 1 << 12, ncclFloat, ncclSum, comm, NULL) == ncclInProgress, "not in flight");
    ncclResult_t r = ncclCommSuspend(comm, NCCL_SUSPEND_MEM);
    RASSERT(r == ncclInvalidUsage && strstr(ncclGetLastError(NULL), "still in progress"),
            "suspend during a call in flight: %d: %s", (int)r, ncclGetLastError(NULL));
    RASSERT(write(go[1], "g", 1) == 1, "write");
    close(go[1]);
    if (wait_done(comm, ncclInProgress))
      return 1;
  } else {
    close(go[1]);
    char b;
    RASSERT(read(go[0], &b, 1) == 1, "rank 0 never tried");
    close(go[0]);
    if (wait_done(comm, ncclAllReduce(x, x, 1 << 12, ncclFloat, ncclSum, comm, NULL)))
      return 1;
  }
  RASSERT(x[0] == 3 && x[4095] == 3, "the AllReduce gave %g", x[0]);
  RCHECK(comm, ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  RCHECK(comm, ncclCommResume(comm));
  if (wait_done(comm, ncclAllReduce(x, x, 1 << 12, ncclFloat, ncclSum, comm, NULL)))
    return 1;
  RASSERT(x[0] == 6 && x[4095] == 6, "after resuming the AllReduce gave %g", x[0]);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(suspend_nonblocking_busy) {
  setenv("LOOM_DEVICE", "host", 1);
  int go[2];
  ASSERT(pipe(go) == 0);
  int r = run_ranks(2, busy_rank, go);
  close(go[0]);
  close(go[1]);
  return r;
}

static int says(ncclComm_t comm, ncclResult_t got, ncclResult_t want, const char *words, const char *what) {
  const char *msg = ncclGetLastError(comm);
  if (got != want || strstr(msg, words) == NULL) {
    fprintf(stderr, "%s returned %d (%s), wanted %d and \"%s\"\n", what, (int)got, msg, (int)want, words);
    return 1;
  }
  return 0;
}
#define SAYS(comm, call, want, words) says((comm), (call), (want), (words), #call)

TEST_IMPL(suspend_bad_args) {
  setenv("LOOM_DEVICE", "host", 1);
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  uint64_t v = 7;
  float x = 1;
  if (SAYS(NULL, ncclCommSuspend(NULL, NCCL_SUSPEND_MEM), ncclInvalidArgument, "comm is NULL") ||
      SAYS(NULL, ncclCommResume(NULL), ncclInvalidArgument, "comm is NULL") ||
      SAYS(NULL, ncclCommMemStats(NULL, ncclStatGpuMemTotal, &v), ncclInvalidArgument, "comm is NULL") ||
      SAYS(NULL, ncclCommSuspend((ncclComm_t)&x, NCCL_SUSPEND_MEM), ncclInvalidArgument, "not a communicator") ||
      SAYS(comm, ncclCommSuspend(comm, 0x2), ncclInvalidArgument, "the only flag is NCCL_SUSPEND_MEM") ||
      SAYS(comm, ncclCommSuspend(comm, NCCL_SUSPEND_MEM | 0x10), ncclInvalidArgument, "flags is 0x11") ||
      SAYS(comm, ncclCommResume(comm), ncclInvalidUsage, "not suspended") ||
      SAYS(comm, ncclCommMemStats(comm, ncclStatGpuMemTotal, NULL), ncclInvalidArgument, "value is NULL") ||
      SAYS(comm, ncclCommMemStats(comm, (ncclCommMemStat_t)4, &v), ncclInvalidArgument, "stat is 4") ||
      SAYS(comm, ncclCommMemStats(comm, (ncclCommMemStat_t)-1, &v), ncclInvalidArgument, "stat is -1"))
    return 1;
  ASSERT(v == 7);
  /* No flag: nothing suspended, as in NCCL. */
  ASSERT_OK(ncclCommSuspend(comm, 0));
  ASSERT_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
  ASSERT(v == 0);
  /* One rank has no connections: nothing to release, and it works. */
  ASSERT_OK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &v));
  ASSERT(v == 0);
  /* Not with operations of the communicator queued in an open group. */
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL));
  if (SAYS(comm, ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage, "operations queued in this group"))
    return 1;
  ASSERT_OK(ncclGroupEnd());
  ASSERT(x == 1);
  ASSERT_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  ASSERT_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
  ASSERT(v == 1);
  if (SAYS(comm, ncclCommSuspend(comm, 0), ncclInvalidUsage, "suspended already") ||
      SAYS(comm, ncclCommSuspend(comm, 0x4), ncclInvalidArgument, "flags is 0x4"))
    return 1;
  ASSERT_OK(ncclCommResume(comm));
  x = 2;
  ASSERT_OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL));
  ASSERT(x == 2);
  /* Aborting a suspended communicator is fine too. */
  ASSERT_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  ASSERT_OK(ncclCommAbort(comm));
  return 0;
}

#if LOOM_TEST_CUDA
/* A CUDA communicator: its device memory (p2p FIFOs and the launch
 * arenas) is counted, released and made again; its kernels work after. */
static int gpu_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const char *transport = arg;
  CUDA_OK(cudaSetDevice(rank % harness_cuda_devices()));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  if (calls_work(comm, rank, n, 4096))
    return 1;
  const char *tr = NULL;
  RCHECK(comm, loomCommPeerTransport(comm, (rank + 1) % n, &tr));
  RASSERT(strcmp(tr, transport) == 0, "rank %d reaches its peer over %s, not %s", rank, tr, transport);
  struct stats before, during, after;
  if (read_stats(comm, &before))
    return 1;
  RASSERT(before.suspend > 0 && before.suspended == 0, "before: %llu", (unsigned long long)before.suspend);
  RCHECK(comm, ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  if (read_stats(comm, &during))
    return 1;
  RASSERT(during.suspended == 1 && during.suspend == before.suspend, "during: %llu",
          (unsigned long long)during.suspend);
  float x = 0;
  if (refused_suspended(comm, ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL), "ncclAllReduce"))
    return 1;
  RCHECK(comm, ncclCommResume(comm));
  if (read_stats(comm, &after))
    return 1;
  /* The launch arenas come back at their first size, and grow again. */
  RASSERT(after.suspended == 0 && after.suspend > 0 && after.suspend <= before.suspend, "after: %llu (before %llu)",
          (unsigned long long)after.suspend, (unsigned long long)before.suspend);
  if (calls_work(comm, rank, n, 4096) || calls_work(comm, rank, n, 5))
    return 1;
  RCHECK(comm, loomCommPeerTransport(comm, (rank + 1) % n, &tr));
  RASSERT(strcmp(tr, transport) == 0, "after resuming, rank %d reaches its peer over %s", rank, tr);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int gpu_suspend(const char *transport) {
  NEED_GPU();
  if (strcmp(transport, "p2p") != 0)
    setenv("NCCL_P2P_DISABLE", "1", 1);
  if (strcmp(transport, "net/socket") == 0) {
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  return run_ranks(2, gpu_rank, (void *)transport);
}

TEST_IMPL(gpu_suspend_2) { return gpu_suspend("p2p"); }
TEST_IMPL(gpu_suspend_shm_2) { return gpu_suspend("shm"); }
TEST_IMPL(gpu_suspend_socket_2) { return gpu_suspend("net/socket"); }
#else
NO_CUDA(gpu_suspend_2)
NO_CUDA(gpu_suspend_shm_2)
NO_CUDA(gpu_suspend_socket_2)
#endif
