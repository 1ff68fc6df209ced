/*
 * One-sided operations (NCCL 2.29-2.30) on host communicators whose
 * ranks are processes of one host: windows from ncclMemAlloc registered
 * by every rank together, puts with signals from every rank to every
 * rank, signals without data, waits that consume what they wait for, the
 * peers' windows loaded and stored through ncclGetPeerDevicePointer;
 * windows on malloc memory and bad arguments refused with a sentence,
 * and a pointer to a window on another host too; a wait for a signal
 * never sent fails after LOOM_TIMEOUT naming the peer, and a wait on a
 * peer that died says so.
 * CUDA communicators (gpu_rma_put_signal, in the emulation): windows by
 * CUDA IPC, puts and signals queued on the stream.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_test.h"
#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { COUNT = 1000 };

static int says(ncclComm_t comm, ncclResult_t got, ncclResult_t want, const char *words, const char *call) {
  const char *msg = ncclGetLastError(comm);
  RASSERT(got == want, "%s returned %d (%s), not %d", call, (int)got, msg, (int)want);
  RASSERT(strstr(msg, words) != NULL, "%s: the sentence should say \"%s\": %s", call, words, msg);
  return 0;
}
#define SAYS(comm, call, want, words)                                                                                  \
  do {                                                                                                                 \
    if (says((comm), (call), (want), (words), #call))                                                                  \
      return 1;                                                                                                        \
  } while (0)

/* Every rank signals every rank (itself too) on sigIdx 1, then waits for
 * them all: no rank leaves before every rank has arrived. */
static int barrier(ncclComm_t comm, int n) {
  ncclWaitSignalDesc_t d[16];
  RCHECK(comm, ncclGroupStart());
  for (int r = 0; r < n; r++) {
    RCHECK(comm, ncclSignal(r, 1, 0, 0, comm, NULL));
    d[r] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = r, .sigIdx = 1, .ctx = 0};
  }
  RCHECK(comm, ncclGroupEnd());
  RCHECK(comm, ncclWaitSignal(n, d, comm, NULL));
  return 0;
}

static int32_t value(int it, int from, int to, int i) { return it * 1000000 + from * 10000 + to * 1000 + i % 1000; }

/* Rank r writes its block into slot r of every rank's window, several
 * rounds, with a barrier between rounds so that nothing is overwritten
 * before it is read. Then counts: two signals waited as one opCnt of 2,
 * and a descriptor given twice adds up. */
static int all_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  RCHECK(comm, ncclCommQueryProperties(comm, &props));
  RASSERT(props.hostRmaSupport, "one host: hostRmaSupport should be true");
  int32_t *win_buf = NULL, *src = malloc(COUNT * sizeof *src);
  RASSERT(src, "out of memory");
  size_t bytes = (size_t)n * COUNT * sizeof(int32_t);
  RCHECK(comm, ncclMemAlloc((void **)&win_buf, bytes));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, win_buf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  ncclWaitSignalDesc_t d[16];
  for (int it = 0; it < 3; it++) {
    RCHECK(comm, ncclGroupStart());
    for (int to = 0; to < n; to++) {
      for (int i = 0; i < COUNT; i++)
        src[i] = value(it, rank, to, i);
      /* The data is taken when the call returns: src is rewritten next. */
      RCHECK(comm, ncclPutSignal(src, COUNT, ncclInt32, to, win, (size_t)rank * COUNT * sizeof(int32_t), 0, 0, 0,
                                 comm, NULL));
      d[to] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = to, .sigIdx = 0, .ctx = 0};
    }
    RCHECK(comm, ncclGroupEnd());
    RCHECK(comm, ncclWaitSignal(n, d, comm, NULL));
    for (int from = 0; from < n; from++)
      for (int i = 0; i < COUNT; i++)
        RASSERT(win_buf[from * COUNT + i] == value(it, from, rank, i), "round %d: rank %d's element %d is %d", it,
                from, i, win_buf[from * COUNT + i]);
    if (barrier(comm, n))
      return 1;
  }
  /* Two signals to the next rank on ctx 2, sigIdx 3; it waits for both
   * at once, then a descriptor given twice (1 + 1) for two more. */
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  RCHECK(comm, ncclSignal(next, 3, 2, 0, comm, NULL));
  RCHECK(comm, ncclSignal(next, 3, 2, 0, comm, NULL));
  d[0] = (ncclWaitSignalDesc_t){.opCnt = 2, .peer = prev, .sigIdx = 3, .ctx = 2};
  RCHECK(comm, ncclWaitSignal(1, d, comm, NULL));
  RCHECK(comm, ncclSignal(next, 3, 2, 0, comm, NULL));
  RCHECK(comm, ncclSignal(next, 3, 2, 0, comm, NULL));
  d[1] = d[0];
  d[0].opCnt = d[1].opCnt = 1;
  RCHECK(comm, ncclWaitSignal(2, d, comm, NULL));
  /* A put of nothing is a signal. */
  RCHECK(comm, ncclPutSignal(NULL, 0, ncclInt32, next, win, 0, 0, 0, 0, comm, NULL));
  d[0] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = prev, .sigIdx = 0, .ctx = 0};
  RCHECK(comm, ncclWaitSignal(1, d, comm, NULL));
  if (barrier(comm, n))
    return 1;
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  RCHECK(comm, ncclMemFree(win_buf));
  /* The communicator still runs collectives. */
  int32_t one = 1;
  RCHECK(comm, ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, NULL));
  RASSERT(one == n, "AllReduce gave %d", one);
  RCHECK(comm, ncclCommDestroy(comm));
  free(src);
  return 0;
}

TEST_IMPL(rma_put_signal_all) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(4, all_rank, NULL);
}

/* Stores into every peer's window through its pointer, a signal to say
 * so, then loads from the peers' windows what they stored. */
static int pointer_rank(int rank, int n, ncclUniqueId id, void *arg) {
  if (arg)
    setenv("LOOM_SHM_PIDFD_GETFD", "0", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int64_t *buf;
  size_t bytes = 4096;
  RCHECK(comm, ncclMemAlloc((void **)&buf, bytes));
  memset(buf, 0, bytes);
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, buf, bytes, &win, NCCL_WIN_DEFAULT));
  for (int p = 0; p < n; p++) {
    int64_t *ptr = NULL, *lsa = NULL;
    RCHECK(comm, ncclGetPeerDevicePointer(win, (size_t)rank * sizeof(int64_t), p, (void **)&ptr));
    RCHECK(comm, ncclGetLsaDevicePointer(win, (size_t)rank * sizeof(int64_t), p, (void **)&lsa));
    RASSERT(ptr != NULL && ptr == lsa, "peer %d: %p and LSA %p", p, (void *)ptr, (void *)lsa);
    if (p == rank)
      RASSERT(ptr == buf + rank, "this rank's own window is %p, not %p", (void *)ptr, (void *)(buf + rank));
    *ptr = 100 * rank + p;
    ptr[n] = -(100 * rank + p); /* a second word, in the second half */
  }
  if (barrier(comm, n))
    return 1;
  for (int from = 0; from < n; from++)
    RASSERT(buf[from] == 100 * from + rank && buf[n + from] == -(100 * from + rank),
            "slot %d holds %lld and %lld", from, (long long)buf[from], (long long)buf[n + from]);
  /* Loads: what rank p got from rank q. */
  for (int p = 0; p < n; p++) {
    int64_t *base;
    RCHECK(comm, ncclGetPeerDevicePointer(win, 0, p, (void **)&base));
    for (int q = 0; q < n; q++)
      RASSERT(base[q] == 100 * q + p, "rank %d's slot %d reads %lld", p, q, (long long)base[q]);
  }
  void *out = (void *)1;
  SAYS(comm, ncclGetPeerDevicePointer(win, bytes, 0, &out), ncclInvalidArgument, "past the end");
  RASSERT(out == NULL, "a refused call left %p", out);
  SAYS(comm, ncclGetPeerDevicePointer(win, 0, n, &out), ncclInvalidArgument, "out of range");
  SAYS(comm, ncclGetLsaDevicePointer(win, 0, -1, &out), ncclInvalidArgument, "LSA team");
  /* Without a window there is no communicator to keep the sentence. */
  SAYS(NULL, ncclGetPeerDevicePointer(win, 0, 0, NULL), ncclInvalidArgument, "outPtr is NULL");
  SAYS(NULL, ncclGetPeerDevicePointer(NULL, 0, 0, &out), ncclInvalidArgument, "window is NULL");
  static uint64_t bogus[16];
  SAYS(NULL, ncclGetPeerDevicePointer((ncclWindow_t)(void *)bogus, 0, 0, &out), ncclInvalidArgument,
       "not a registered window");
  if (barrier(comm, n))
    return 1;
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  SAYS(NULL, ncclGetPeerDevicePointer(win, 0, 0, &out), ncclInvalidArgument, "registered window");
  RCHECK(comm, ncclMemFree(buf));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rma_peer_pointer) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(3, pointer_rank, NULL);
}

/* The same, the peers' memory taken through /proc/<pid>/fd instead of
 * pidfd_getfd (which Yama's ptrace scope may refuse). */
TEST_IMPL(rma_peer_pointer_proc) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(3, pointer_rank, "proc");
}

/* A window on malloc memory: this rank's own process reaches it; the
 * other's gets no pointer, saying why, and its puts are written into
 * this process (process_vm_writev) where it may. */
static int malloc_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int32_t *buf = calloc(1024, sizeof *buf), x[4] = {1, 2, 3, 4};
  RASSERT(buf, "out of memory");
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, buf, 1024 * sizeof *buf, &win, NCCL_WIN_DEFAULT));
  int peer = 1 - rank;
  /* A put writes into the peer's process where this one may ptrace it;
   * elsewhere it is refused, saying why. Both ranks run alike. */
  ncclResult_t r = ncclPutSignal(x, 4, ncclInt32, peer, win, 0, 0, 0, 0, comm, NULL);
  if (r != ncclSuccess) {
    const char *msg = ncclGetLastError(comm);
    RASSERT(r == ncclInvalidUsage && strstr(msg, "ncclMemAlloc") && strstr(msg, "process_vm_writev"), "%d: %s",
            (int)r, msg);
    fprintf(stderr, "rank %d: %s\n", rank, msg);
    RCHECK(comm, ncclSignal(peer, 0, 0, 0, comm, NULL));
  }
  ncclWaitSignalDesc_t from_peer = {.opCnt = 1, .peer = peer, .sigIdx = 0, .ctx = 0};
  RCHECK(comm, ncclWaitSignal(1, &from_peer, comm, NULL));
  if (r == ncclSuccess)
    RASSERT(buf[0] == 1 && buf[3] == 4, "the peer's put wrote %d..%d", buf[0], buf[3]);
  SAYS(comm, ncclPutSignal(x, 4, ncclInt32, peer, win, 4096, 0, 0, 0, comm, NULL), ncclInvalidArgument, "do not fit");
  void *p = NULL;
  SAYS(comm, ncclGetPeerDevicePointer(win, 0, peer, &p), ncclInvalidUsage, "ncclMemAlloc");
  RCHECK(comm, ncclPutSignal(x, 4, ncclInt32, rank, win, 16, 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = rank, .sigIdx = 0, .ctx = 0};
  RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL));
  RASSERT(buf[4] == 1 && buf[7] == 4, "the put to itself wrote %d..%d", buf[4], buf[7]);
  RCHECK(comm, ncclGetPeerDevicePointer(win, 8, rank, &p));
  RASSERT(p == (char *)buf + 8, "its own window is at %p, not %p", p, (void *)((char *)buf + 8));
  if (barrier(comm, n))
    return 1;
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  free(buf);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rma_malloc_window) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, malloc_rank, NULL);
}

/* Ranks of one process (threads) reach each other's windows whatever
 * the memory. */
static int thread_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int32_t buf[64] = {0}, x = 7 + rank;
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_DEFAULT));
  RCHECK(comm, ncclPutSignal(&x, 1, ncclInt32, 1 - rank, win, 4 * sizeof(int32_t), 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = 1 - rank, .sigIdx = 0, .ctx = 0};
  RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL));
  RASSERT(buf[4] == 7 + (1 - rank), "rank %d got %d", rank, buf[4]);
  if (barrier(comm, n))
    return 1;
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rma_threads) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_rank_threads(2, thread_rank, NULL);
}

/* Every argument checked, with a sentence, before anything is done. */
static int bad_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = 0, .sigIdx = 0, .ctx = 0};
  /* Signals need no window: the communicator has them from its init. */
  RCHECK(comm, ncclSignal(1 - rank, 5, 1, 0, comm, NULL));
  ncclWaitSignalDesc_t first = {.opCnt = 1, .peer = 1 - rank, .sigIdx = 5, .ctx = 1};
  RCHECK(comm, ncclWaitSignal(1, &first, comm, NULL));
  int32_t *buf;
  RCHECK(comm, ncclMemAlloc((void **)&buf, 4096));
  ncclWindow_t win = NULL, w2;
  SAYS(comm, ncclCommWindowRegister(comm, NULL, 4096, &win, 0), ncclInvalidArgument, "buff is NULL");
  SAYS(comm, ncclCommWindowRegister(comm, buf, 4096, NULL, 0), ncclInvalidArgument, "win is NULL");
  SAYS(comm, ncclCommWindowRegister(comm, buf, 0, &win, 0), ncclInvalidArgument, "size is 0");
  SAYS(comm, ncclCommWindowRegister(comm, buf, 4096, &win, 0x100), ncclInvalidArgument, "unknown flags");
  RCHECK(comm, ncclGroupStart());
  SAYS(comm, ncclCommWindowRegister(comm, buf, 4096, &win, 0), ncclInvalidUsage, "group");
  ncclGroupEnd();
  RCHECK(comm, ncclCommWindowRegister(comm, buf, 4096, &win, 0));
  int32_t x[8] = {0};
  int peer = 1 - rank;
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, peer, win, 0, 0, 0, 1, comm, NULL), ncclInvalidArgument, "flags");
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, peer, win, 0, 99, 0, 0, comm, NULL), ncclInvalidArgument, "sigIdx 99");
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, peer, win, 0, 0, -1, 0, comm, NULL), ncclInvalidArgument, "ctx -1");
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, 2, win, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument, "peer 2");
  SAYS(comm, ncclPutSignal(x, 1, (ncclDataType_t)99, peer, win, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "datatype 99");
  SAYS(comm, ncclPutSignal(NULL, 1, ncclInt32, peer, win, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "localbuff is NULL");
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, peer, NULL, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "not registered on this communicator");
  SAYS(comm, ncclPutSignal(x, 2, ncclInt32, peer, win, 4096 - 4, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "do not fit");
  SAYS(comm, ncclPutSignal(x, SIZE_MAX / 2, ncclInt32, peer, win, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "do not fit");
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, peer, win, SIZE_MAX, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "do not fit");
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, peer, win, 0, 0, 0, 0, comm, (cudaStream_t)x), ncclInvalidArgument,
       "stream must be NULL");
  SAYS(comm, ncclSignal(-1, 0, 0, 0, comm, NULL), ncclInvalidArgument, "peer -1");
  SAYS(comm, ncclSignal(peer, 8, 0, 0, comm, NULL), ncclInvalidArgument, "sigIdx");
  SAYS(comm, ncclSignal(peer, 0, 0, 4, comm, NULL), ncclInvalidArgument, "flags");
  SAYS(NULL, ncclSignal(peer, 0, 0, 0, NULL, NULL), ncclInvalidArgument, "NULL");
  SAYS(comm, ncclWaitSignal(-1, &d, comm, NULL), ncclInvalidArgument, "nDesc");
  SAYS(comm, ncclWaitSignal(1, NULL, comm, NULL), ncclInvalidArgument, "signalDescs is NULL");
  ncclWaitSignalDesc_t bad = {.opCnt = -1, .peer = 0, .sigIdx = 0, .ctx = 0};
  SAYS(comm, ncclWaitSignal(1, &bad, comm, NULL), ncclInvalidArgument, "opCnt");
  bad = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = 7, .sigIdx = 0, .ctx = 0};
  SAYS(comm, ncclWaitSignal(1, &bad, comm, NULL), ncclInvalidArgument, "peer 7");
  bad = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = 0, .sigIdx = 0, .ctx = 9};
  SAYS(comm, ncclWaitSignal(1, &bad, comm, NULL), ncclInvalidArgument, "ctx 9");
  RCHECK(comm, ncclWaitSignal(0, NULL, comm, NULL));
  RCHECK(comm, ncclGroupStart());
  SAYS(comm, ncclWaitSignal(1, &d, comm, NULL), ncclInvalidUsage, "after ncclGroupEnd");
  RASSERT(ncclGroupEnd() != ncclSuccess, "a group with a refused call should fail");
  /* A window of another communicator is none of this one's. */
  ncclComm_t solo;
  int dev = 0;
  RCHECK(NULL, ncclCommInitAll(&solo, 1, &dev));
  RCHECK(solo, ncclCommWindowRegister(solo, buf, 64, &w2, 0));
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, peer, w2, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "not registered on this communicator");
  SAYS(comm, ncclCommWindowDeregister(comm, w2), ncclInvalidArgument, "not registered on this communicator");
  RCHECK(solo, ncclCommWindowDeregister(solo, w2));
  RCHECK(solo, ncclCommDestroy(solo));
  /* Nothing refused was done: no signal is pending anywhere. Each rank
   * signals its peer once, and waits for exactly one. */
  RCHECK(comm, ncclPutSignal(x, 1, ncclInt32, peer, win, 0, 0, 0, 0, comm, NULL));
  d.peer = peer;
  RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL));
  if (barrier(comm, n))
    return 1;
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  SAYS(comm, ncclCommWindowDeregister(comm, win), ncclInvalidArgument, "not registered");
  /* Sizes: rank 0's window is smaller. Symmetric (asked by rank 1 only),
   * both ranks refuse; otherwise each put is checked against the size
   * of the window it goes into. */
  size_t mine = rank == 0 ? 1024 : 4096;
  SAYS(comm, ncclCommWindowRegister(comm, buf, mine, &win, rank == 1 ? NCCL_WIN_COLL_SYMMETRIC : 0),
       ncclInvalidUsage, "one size on every rank");
  RCHECK(comm, ncclCommWindowRegister(comm, buf, mine, &win, 0));
  if (rank == 1)
    SAYS(comm, ncclPutSignal(x, 8, ncclInt32, 0, win, 1000, 0, 0, 0, comm, NULL), ncclInvalidArgument,
         "rank 0's window of 1024 bytes");
  else
    RCHECK(comm, ncclPutSignal(x, 8, ncclInt32, 1, win, 1000, 0, 0, 0, comm, NULL));
  if (rank == 1) {
    d.peer = 0;
    RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL));
  }
  if (barrier(comm, n))
    return 1;
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  SAYS(comm, ncclPutSignal(x, 1, ncclInt32, peer, win, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "not registered");
  RCHECK(comm, ncclMemFree(buf));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rma_bad_args) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, bad_rank, NULL);
}

/* Rank 0 waits for a signal rank 1 never sends: LOOM_TIMEOUT (2 s)
 * later it fails naming rank 1, consumes nothing, and a later wait
 * works. */
static int timeout_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  setenv("LOOM_TIMEOUT", rank == 0 ? "2" : "60", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int32_t *buf;
  RCHECK(comm, ncclMemAlloc((void **)&buf, 4096));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, buf, 4096, &win, 0));
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = 1 - rank, .sigIdx = 0, .ctx = 0};
  if (rank == 0) {
    /* One signal from rank 1 on sigIdx 2 came; the wait asks for two. */
    ncclWaitSignalDesc_t two = {.opCnt = 2, .peer = 1, .sigIdx = 2, .ctx = 0};
    double t0 = now_s();
    ncclResult_t r = ncclWaitSignal(1, &two, comm, NULL);
    double took = now_s() - t0;
    const char *msg = ncclGetLastError(comm);
    fprintf(stderr, "rank 0: %.1f s: %s\n", took, msg);
    RASSERT(r == ncclRemoteError, "the wait returned %d: %s", (int)r, msg);
    RASSERT(strstr(msg, "from rank 1") && strstr(msg, "LOOM_TIMEOUT") && strstr(msg, "is still running") &&
                strstr(msg, "1 came"),
            "%s", msg);
    RASSERT(took >= 1.5 && took < 15, "the wait took %.1f s", took);
    /* The signal that came is still there: one more makes two. */
    RCHECK(comm, ncclSignal(1, 0, 0, 0, comm, NULL));
    RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL));
    RCHECK(comm, ncclWaitSignal(1, &two, comm, NULL));
  } else {
    RCHECK(comm, ncclSignal(0, 2, 0, 0, comm, NULL));
    RCHECK(comm, ncclWaitSignal(1, &d, comm, NULL)); /* rank 0's, once its wait failed */
    RCHECK(comm, ncclSignal(0, 0, 0, 0, comm, NULL));
    RCHECK(comm, ncclSignal(0, 2, 0, 0, comm, NULL));
  }
  if (barrier(comm, n))
    return 1;
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  RCHECK(comm, ncclMemFree(buf));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rma_wait_timeout) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, timeout_rank, NULL);
}

/* Rank 1 exits while rank 0 waits for its signal: the wait says so,
 * well within LOOM_TIMEOUT. */
static int dead_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  setenv("LOOM_TIMEOUT", "60", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int32_t *buf;
  RCHECK(comm, ncclMemAlloc((void **)&buf, 4096));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, buf, 4096, &win, 0));
  if (rank == 1)
    _exit(0); /* gone, like a crash */
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = 1, .sigIdx = 0, .ctx = 0};
  double t0 = now_s();
  ncclResult_t r = ncclWaitSignal(1, &d, comm, NULL);
  const char *msg = ncclGetLastError(comm);
  fprintf(stderr, "rank 0: %.1f s: %s\n", now_s() - t0, msg);
  RASSERT(r == ncclRemoteError && strstr(msg, "rank 1") && strstr(msg, "has exited"), "%d: %s", (int)r, msg);
  RASSERT(now_s() - t0 < 10, "took %.1f s", now_s() - t0);
  RCHECK(NULL, ncclCommAbort(comm));
  RCHECK(NULL, ncclMemFree(buf));
  return 0;
}

TEST_IMPL(rma_wait_dead_peer) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, dead_rank, NULL);
}

/* Ranks on hosts of their own (NCCL_HOSTID): a put and a signal reach
 * the other host's window through its one-sided service
 * (test_rma_net.c has more); its window's pointer is refused, since no
 * load or store reaches another host; the rank's own window works. */
static int hosts_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  char host[32];
  snprintf(host, sizeof host, "rmahost%d", rank);
  setenv("NCCL_HOSTID", host, 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int peer = 1 - rank;
  /* The peer's service address comes with the first registration. */
  SAYS(comm, ncclSignal(peer, 0, 0, 0, comm, NULL), ncclInvalidUsage, "register one");
  int32_t *buf, x = 5, y = 70 + rank;
  RCHECK(comm, ncclMemAlloc((void **)&buf, 4096));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, buf, 4096, &win, 0));
  void *p;
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  RCHECK(comm, ncclCommQueryProperties(comm, &props));
  RASSERT(props.hostRmaSupport, "a host communicator on two hosts: hostRmaSupport should be true");
  SAYS(comm, ncclGetPeerDevicePointer(win, 0, peer, &p), ncclInvalidUsage, "another host");
  RCHECK(comm, ncclPutSignal(&y, 1, ncclInt32, peer, win, sizeof(int32_t), 0, 0, 0, comm, NULL));
  RCHECK(comm, ncclSignal(peer, 2, 0, 0, comm, NULL));
  RCHECK(comm, ncclPutSignal(&x, 1, ncclInt32, rank, win, 0, 0, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t d[3] = {{.opCnt = 1, .peer = rank, .sigIdx = 0, .ctx = 0},
                               {.opCnt = 1, .peer = peer, .sigIdx = 0, .ctx = 0},
                               {.opCnt = 1, .peer = peer, .sigIdx = 2, .ctx = 0}};
  RCHECK(comm, ncclWaitSignal(3, d, comm, NULL));
  RASSERT(buf[0] == 5, "the put to itself wrote %d", buf[0]);
  RASSERT(buf[1] == 70 + peer, "rank %d's put from another host wrote %d", peer, buf[1]);
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  RCHECK(comm, ncclMemFree(buf));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(rma_other_host) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, hosts_rank, NULL);
}

/* ncclCommAbort from another thread stops a wait for a signal that never
 * comes, well within LOOM_TIMEOUT. */
struct abort_arg {
  ncclComm_t comm;
  int pipe_r;
};

static void *aborter(void *p) {
  struct abort_arg *a = p;
  char c;
  /* The waiter says when it is about to wait; the abort then finds it
   * inside the call or refuses its entry, both of which end the wait. */
  if (read(a->pipe_r, &c, 1) != 1)
    return NULL;
  ncclCommAbort(a->comm);
  return NULL;
}

TEST_IMPL(rma_wait_abort) {
  setenv("LOOM_DEVICE", "host", 1);
  setenv("LOOM_TIMEOUT", "60", 1);
  ncclComm_t comm;
  ASSERT_OK(ncclCommInitAll(&comm, 1, NULL));
  static char buf[4096];
  ncclWindow_t win;
  ASSERT_OK(ncclCommWindowRegister(comm, buf, sizeof buf, &win, 0));
  int fds[2];
  ASSERT(pipe(fds) == 0);
  struct abort_arg a = {comm, fds[0]};
  pthread_t t;
  ASSERT(pthread_create(&t, NULL, aborter, &a) == 0);
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = 0, .sigIdx = 0, .ctx = 0};
  ASSERT(write(fds[1], "x", 1) == 1);
  double t0 = now_s();
  ncclResult_t r = ncclWaitSignal(1, &d, comm, NULL);
  double took = now_s() - t0;
  const char *msg = ncclGetLastError(NULL);
  fprintf(stderr, "%.2f s: %s\n", took, msg);
  /* The abort may stop the wait ("aborted"), or be under way when the
   * call begins ("inside ncclCommAbort"), or, rarely, be over before it:
   * then the call finds no communicator, which is as good an answer. */
  ASSERT_MSG((r == ncclInvalidUsage &&
              (strstr(msg, "abort") != NULL || strstr(msg, "ncclCommAbort") != NULL)) ||
                 (r == ncclInvalidArgument && strstr(msg, "already destroyed") != NULL),
             "%d: %s", (int)r, msg);
  ASSERT_MSG(took < 10, "took %.1f s", took);
  pthread_join(t, NULL);
  close(fds[0]);
  close(fds[1]);
  return 0;
}

#if LOOM_TEST_CUDA
/* CUDA communicators, ranks as processes of one host: windows of device
 * memory from ncclMemAlloc, opened by CUDA IPC; puts queued on the
 * stream, signals raised when the stream gets there, waits on the host;
 * the peer's pointer written with a device copy; a window of cudaMalloc
 * memory refused for puts from the other process. */
static int cuda_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  RASSERT(tbuf_is_cuda(comm), "not a CUDA communicator");
  enum { N = 256 };
  size_t bytes = (size_t)n * N * sizeof(int32_t);
  int32_t *win_d, *src_d, h[4 * N];
  RCHECK(comm, ncclMemAlloc((void **)&win_d, bytes));
  CUDA_OK(cudaMalloc((void **)&src_d, N * sizeof(int32_t)));
  CUDA_OK(cudaMemset(win_d, 0, bytes));
  /* Zeroed before any peer can put into it (the registration is
   * collective): cudaMemset is asynchronous. */
  CUDA_OK(cudaStreamSynchronize(NULL));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, win_d, bytes, &win, NCCL_WIN_DEFAULT));
  for (int i = 0; i < N; i++)
    h[i] = 1000 * rank + i;
  CUDA_OK(cudaMemcpy(src_d, h, N * sizeof(int32_t), cudaMemcpyHostToDevice));
  ncclWaitSignalDesc_t d[4];
  for (int to = 0; to < n; to++) {
    RCHECK(comm, ncclPutSignal(src_d, N, ncclInt32, to, win, (size_t)rank * N * sizeof(int32_t), 0, 0, 0, comm,
                               NULL));
    d[to] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = to, .sigIdx = 0, .ctx = 0};
  }
  RCHECK(comm, ncclWaitSignal(n, d, comm, NULL));
  CUDA_OK(cudaMemcpy(h, win_d, bytes, cudaMemcpyDeviceToHost));
  for (int from = 0; from < n; from++)
    for (int i = 0; i < N; i++)
      RASSERT(h[from * N + i] == 1000 * from + i, "rank %d's element %d is %d", from, i, h[from * N + i]);
  /* Every rank has read its window before any writes into it again. */
  for (int r = 0; r < n; r++) {
    RCHECK(comm, ncclSignal(r, 3, 0, 0, comm, NULL));
    d[r] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = r, .sigIdx = 3, .ctx = 0};
  }
  RCHECK(comm, ncclWaitSignal(n, d, comm, NULL));
  /* Through the pointer: a device copy into the next rank's first
   * element, then a signal on the stream after it. */
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  int32_t *peer_d = NULL, v = -7 - rank;
  RCHECK(comm, ncclGetPeerDevicePointer(win, 0, next, (void **)&peer_d));
  RASSERT(peer_d != NULL, "no pointer");
  CUDA_OK(cudaMemcpyAsync(peer_d, &v, sizeof v, cudaMemcpyHostToDevice, NULL));
  RCHECK(comm, ncclSignal(next, 1, 0, 0, comm, NULL));
  d[0] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = prev, .sigIdx = 1, .ctx = 0};
  RCHECK(comm, ncclWaitSignal(1, d, comm, NULL));
  CUDA_OK(cudaMemcpy(h, win_d, sizeof(int32_t), cudaMemcpyDeviceToHost));
  RASSERT(h[0] == -7 - prev, "the pointer's store gave %d", h[0]);
  /* cudaMalloc memory: the other process gets no way in. */
  ncclWindow_t w2;
  RCHECK(comm, ncclCommWindowRegister(comm, src_d, N * sizeof(int32_t), &w2, 0));
  SAYS(comm, ncclPutSignal(src_d, 1, ncclInt32, 1 - rank, w2, 0, 0, 0, 0, comm, NULL), ncclInvalidUsage,
       "ncclMemAlloc");
  SAYS(comm, ncclPutSignal(h, 1, ncclInt32, rank, w2, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument, "localbuff");
  /* Barrier, then the windows go. */
  for (int r = 0; r < n; r++) {
    RCHECK(comm, ncclSignal(r, 2, 0, 0, comm, NULL));
    d[r] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = r, .sigIdx = 2, .ctx = 0};
  }
  RCHECK(comm, ncclWaitSignal(n, d, comm, NULL));
  CUDA_OK(cudaStreamSynchronize(NULL));
  RCHECK(comm, ncclCommWindowDeregister(comm, w2));
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  RCHECK(comm, ncclMemFree(win_d));
  CUDA_OK(cudaFree(src_d));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(gpu_rma_put_signal) {
  NEED_GPU();
  return run_ranks(2, cuda_rank, NULL);
}
/* Ranks as threads of one process on CUDA communicators: a window of
 * cudaMalloc memory is reached by its pointer; each rank its own stream. */
static int cuda_thread_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { N = 128 };
  int32_t *win_d, *src_d, h[N];
  CUDA_OK(cudaMalloc((void **)&win_d, n * N * sizeof(int32_t)));
  CUDA_OK(cudaMalloc((void **)&src_d, N * sizeof(int32_t)));
  for (int i = 0; i < N; i++)
    h[i] = 100 * rank + i;
  CUDA_OK(cudaMemcpyAsync(src_d, h, sizeof h, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaStreamSynchronize(s));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, win_d, n * N * sizeof(int32_t), &win, 0));
  ncclWaitSignalDesc_t d[4];
  for (int to = 0; to < n; to++) {
    RCHECK(comm, ncclPutSignal(src_d, N, ncclInt32, to, win, (size_t)rank * N * sizeof(int32_t), 0, 0, 0, comm, s));
    d[to] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = to, .sigIdx = 0, .ctx = 0};
  }
  RCHECK(comm, ncclWaitSignal(n, d, comm, s));
  for (int from = 0; from < n; from++) {
    CUDA_OK(cudaMemcpyAsync(h, win_d + from * N, sizeof h, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++)
      RASSERT(h[i] == 100 * from + i, "rank %d's element %d is %d", from, i, h[i]);
  }
  void *p = NULL;
  RCHECK(comm, ncclGetPeerDevicePointer(win, 8, 1 - rank, &p));
  RASSERT(p != NULL, "no pointer");
  for (int r = 0; r < n; r++) {
    RCHECK(comm, ncclSignal(r, 1, 0, 0, comm, s));
    d[r] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = r, .sigIdx = 1, .ctx = 0};
  }
  RCHECK(comm, ncclWaitSignal(n, d, comm, s));
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  CUDA_OK(cudaStreamSynchronize(s));
  RCHECK(comm, ncclCommDestroy(comm));
  CUDA_OK(cudaFree(win_d));
  CUDA_OK(cudaFree(src_d));
  CUDA_OK(cudaStreamDestroy(s));
  return 0;
}

TEST_IMPL(gpu_rma_threads) {
  NEED_GPU();
  return run_rank_threads(2, cuda_thread_rank, NULL);
}

/* CUDA communicators whose ranks are on hosts of their own: puts and
 * signals across hosts are host communicators' only, refused here with
 * the sentence; the pointer too. */
static int cuda_hosts_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  char host[32];
  snprintf(host, sizeof host, "rmagpuhost%d", rank);
  setenv("NCCL_HOSTID", host, 1);
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  RASSERT(tbuf_is_cuda(comm), "not a CUDA communicator");
  int32_t *win_d;
  RCHECK(comm, ncclMemAlloc((void **)&win_d, 4096));
  ncclWindow_t win;
  RCHECK(comm, ncclCommWindowRegister(comm, win_d, 4096, &win, 0));
  int peer = 1 - rank;
  void *p;
  SAYS(comm, ncclPutSignal(win_d, 1, ncclInt32, peer, win, 0, 0, 0, 0, comm, NULL), ncclInvalidUsage,
       "not implemented yet");
  SAYS(comm, ncclSignal(peer, 0, 0, 0, comm, NULL), ncclInvalidUsage, "not implemented yet");
  SAYS(comm, ncclGetPeerDevicePointer(win, 0, peer, &p), ncclInvalidUsage, "another host");
  RCHECK(comm, ncclCommWindowDeregister(comm, win));
  RCHECK(comm, ncclMemFree(win_d));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(gpu_rma_other_host_refused) {
  NEED_GPU();
  return run_ranks(2, cuda_hosts_rank, NULL);
}
#else
NO_CUDA(gpu_rma_put_signal)
NO_CUDA(gpu_rma_threads)
NO_CUDA(gpu_rma_other_host_refused)
#endif
