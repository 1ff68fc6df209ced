/*
 * Nonblocking communicators (ncclConfig_t.blocking = 0): creation and
 * calls return ncclInProgress at once, ncclCommGetAsyncError says when
 * they are done and how; a call before that is refused; errors and aborts
 * come through the same state.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

#define COUNT 100000

/* Polls the state as NCCL documents it, up to `bound_s`. */
static ncclResult_t wait_state(ncclComm_t comm, double bound_s) {
  double t0 = now_s();
  ncclResult_t st = ncclInProgress;
  while (now_s() - t0 < bound_s) {
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess)
      return ncclInternalError;
    if (st != ncclInProgress)
      return st;
    sched_yield();
  }
  return st;
}

static ncclResult_t init_nonblocking(ncclComm_t *comm, int n, ncclUniqueId id, int rank) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(comm, n, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    return r;
  return wait_state(*comm, 20);
}

/* Rank 0's calls return while the others have not called yet (they wait
 * for its word on the pipe), so its state must say ncclInProgress, and
 * its next call must be refused; then all finish with the right sums. */
static int basic_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int *go = arg;
  ncclComm_t comm;
  RCHECK(NULL, init_nonblocking(&comm, n, id, rank));
  float *buf = malloc(COUNT * sizeof *buf), *out = malloc(COUNT * n * sizeof *out);
  RASSERT(buf && out, "out of memory");
  for (int iter = 0; iter < 5; iter++) {
    for (int i = 0; i < COUNT; i++)
      buf[i] = (float)(rank + 1 + iter);
    if (rank != 0) {
      char b;
      RASSERT(read(go[0], &b, 1) == 1, "rank %d: the pipe closed", rank);
    }
    ncclResult_t r = iter % 2 ? ncclAllGather(buf, out, COUNT, ncclFloat, comm, NULL)
                              : ncclAllReduce(buf, out, COUNT, ncclFloat, ncclSum, comm, NULL);
    RASSERT(r == ncclInProgress, "rank %d: a collective on a nonblocking communicator returned %d (%s): %s", rank,
            (int)r, ncclGetErrorString(r), ncclGetLastError(comm));
    if (rank == 0) {
      ncclResult_t st;
      RCHECK(comm, ncclCommGetAsyncError(comm, &st));
      RASSERT(st == ncclInProgress, "rank 0: the state is %d while the peers have not called yet", (int)st);
      r = ncclAllReduce(buf, out, COUNT, ncclFloat, ncclSum, comm, NULL);
      const char *msg = ncclGetLastError(NULL);
      RASSERT(r == ncclInvalidUsage && strstr(msg, "still in progress"),
              "rank 0: a second call while the first is in progress returned %d: %s", (int)r, msg);
      char word[8] = {0};
      RASSERT(write(go[1], word, (size_t)(n - 1)) == n - 1, "rank 0: cannot write the pipe");
    }
    ncclResult_t st = wait_state(comm, 20);
    RASSERT(st == ncclSuccess, "rank %d, iteration %d: the state ended as %d (%s): %s", rank, iter, (int)st,
            ncclGetErrorString(st), ncclGetLastError(comm));
    for (int i = 0; i < COUNT * (iter % 2 ? n : 1); i++) {
      float want = iter % 2 ? (float)(i / COUNT + 1 + iter) : (float)(n * (n + 1) / 2 + n * iter);
      RASSERT(out[i] == want, "rank %d, iteration %d: element %d is %g, not %g", rank, iter, i, out[i], want);
    }
  }
  /* A group of sends and receives around the ring, as one job. */
  ncclGroupStart();
  ncclSend(buf, COUNT, ncclFloat, (rank + 1) % n, comm, NULL);
  ncclRecv(out, COUNT, ncclFloat, (rank + n - 1) % n, comm, NULL);
  ncclResult_t r = ncclGroupEnd();
  RASSERT(r == ncclInProgress || r == ncclSuccess, "rank %d: ncclGroupEnd returned %d: %s", rank, (int)r,
          ncclGetLastError(comm));
  RASSERT(wait_state(comm, 20) == ncclSuccess, "rank %d: the group failed: %s", rank, ncclGetLastError(comm));
  float want = (float)((rank + n - 1) % n + 1 + 4);
  RASSERT(out[0] == want && out[COUNT - 1] == want, "rank %d received %g, not %g", rank, out[0], want);
  free(buf);
  free(out);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(nonblocking_collectives) {
  int go[2];
  ASSERT(pipe(go) == 0);
  setenv("LOOM_TIMEOUT", "30", 1);
  return run_ranks(3, basic_rank, go);
}

/* A peer that exits: the others' state turns into an error that names it,
 * and the communicator can still be aborted. */
static int dead_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, init_nonblocking(&comm, n, id, rank));
  float *buf = calloc(COUNT, sizeof *buf);
  RASSERT(buf, "out of memory");
  ncclResult_t r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  RASSERT(r == ncclInProgress, "rank %d: AllReduce returned %d", rank, (int)r);
  RASSERT(wait_state(comm, 20) == ncclSuccess, "rank %d: the first AllReduce failed: %s", rank,
          ncclGetLastError(comm));
  if (rank == 2)
    _exit(0); /* gone, without a word */
  double t0 = now_s();
  r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  RASSERT(r == ncclInProgress, "rank %d: AllReduce returned %d", rank, (int)r);
  ncclResult_t st = wait_state(comm, 20);
  const char *msg = ncclGetLastError(comm);
  printf("rank %d: state %s after %.2f s: %s\n", rank, ncclGetErrorString(st), now_s() - t0, msg);
  RASSERT(st != ncclSuccess && st != ncclInProgress, "rank %d: the state is %d with rank 2 gone", rank, (int)st);
  /* A survivor may hear of it first from the other survivor giving up. */
  RASSERT(strstr(msg, "rank 2") || strstr(msg, "failed and abandoned"),
          "rank %d: the error names neither rank 2 nor the rank that gave up: %s", rank, msg);
  /* Calls after an error are refused with the first error's sentence. */
  r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  RASSERT(r == st, "rank %d: a call after the error returned %d", rank, (int)r);
  RCHECK(NULL, ncclCommAbort(comm));
  free(buf);
  return 0;
}

TEST_IMPL(nonblocking_dead_peer) {
  setenv("LOOM_TIMEOUT", "30", 1);
  return run_ranks(3, dead_rank, NULL);
}

/* An abort while a job waits for a peer that never calls: it returns at
 * once and leaves nothing behind. Rank 1 is the one that aborts (rank 0
 * owns the bootstrap root's thread and socket). */
static int abort_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int *go = arg;
  int fds0 = harness_count_entries("/proc/self/fd", NULL), threads0 = harness_count_entries("/proc/self/task", NULL);
  ncclComm_t comm;
  RCHECK(NULL, init_nonblocking(&comm, n, id, rank));
  float *buf = calloc(COUNT, sizeof *buf);
  RASSERT(buf, "out of memory");
  if (rank == 0) {
    char b;
    RASSERT(read(go[0], &b, 1) == 1, "rank 0: the pipe closed");
    RCHECK(NULL, ncclCommAbort(comm));
    free(buf);
    return 0;
  }
  ncclResult_t r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  RASSERT(r == ncclInProgress, "rank 1: AllReduce returned %d", (int)r);
  double t0 = now_s();
  RCHECK(NULL, ncclCommAbort(comm));
  double took = now_s() - t0;
  RASSERT(write(go[1], "x", 1) == 1, "rank 1: cannot write the pipe");
  int fds1 = harness_count_entries("/proc/self/fd", NULL), threads1 = harness_count_entries("/proc/self/task", NULL);
  printf("ncclCommAbort took %.3f s; fds %d -> %d, threads %d -> %d\n", took, fds0, fds1, threads0, threads1);
  RASSERT(took < 2, "ncclCommAbort took %.1f s", took);
  RASSERT(fds1 == fds0, "%d file descriptors before the communicator, %d after its abort", fds0, fds1);
  RASSERT(threads1 == threads0, "%d threads before, %d after (the worker must be gone)", threads0, threads1);
  free(buf);
  return 0;
}

TEST_IMPL(nonblocking_abort) {
  int go[2];
  ASSERT(pipe(go) == 0);
  setenv("LOOM_TIMEOUT", "30", 1);
  return run_ranks(2, abort_rank, go);
}

/* A creation that fails (the ranks disagree on NCCL_BUFFSIZE) says so
 * through the state, and the handle can be destroyed. */
static int init_error_rank(int rank, int n, ncclUniqueId id, void *arg) {
  setenv("NCCL_BUFFSIZE", rank == 0 ? "4194304" : "2097152", 1);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &config);
  RASSERT(r == ncclInProgress, "rank %d: a nonblocking creation returned %d", rank, (int)r);
  RASSERT(comm != NULL, "rank %d: no handle", rank);
  ncclResult_t st = wait_state(comm, 20);
  const char *msg = ncclGetLastError(comm);
  RASSERT(st == ncclInvalidUsage && strstr(msg, "NCCL_BUFFSIZE"), "rank %d: the creation ended as %d: %s", rank,
          (int)st, msg);
  RCHECK(NULL, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(nonblocking_init_error) {
  setenv("LOOM_TIMEOUT", "30", 1);
  return run_ranks(2, init_error_rank, NULL);
}

/* One group, one blocking and one nonblocking communicator: refused. */
static int mixed_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t a, b;
  RCHECK(NULL, ncclCommInitRank(&a, 1, id, 0));
  ncclUniqueId id2;
  RCHECK(NULL, ncclGetUniqueId(&id2));
  RCHECK(NULL, init_nonblocking(&b, 1, id2, 0));
  float x[4] = {1, 2, 3, 4};
  ncclGroupStart();
  ncclAllReduce(x, x, 4, ncclFloat, ncclSum, a, NULL);
  ncclAllReduce(x, x, 4, ncclFloat, ncclSum, b, NULL);
  ncclResult_t r = ncclGroupEnd();
  const char *msg = ncclGetLastError(NULL);
  RASSERT(r == ncclInvalidUsage && strstr(msg, "nonblocking") && strstr(msg, "blocking communicators"),
          "a mixed group returned %d: %s", (int)r, msg);
  RCHECK(NULL, ncclCommDestroy(a));
  RCHECK(NULL, ncclCommDestroy(b));
  return 0;
}

TEST_IMPL(nonblocking_mixed_group) { return run_ranks(1, mixed_rank, NULL); }
