/*
 * ncclCommGetUniqueId and ncclCommGrow: two ranks grow to three and to
 * four (the new ranks get the id from rank 0 through a pipe, as a
 * launcher would hand it out); the grown communicator sums right, the
 * existing ranks keep their numbers, and the old communicator still
 * works. A config NULL inherits the parent's (a nonblocking parent grows
 * nonblocking). Refusals: bad arguments, a second id while one is
 * pending, a spent id, and existing ranks that disagree on who holds the
 * id or on the size, which fail on every rank and create nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_test.h"
#include "harness.h"
#include "nccl.h"
#include "test.h"

#define OLD_N 2

struct grow_arg {
  int fd[2];    /* rank 0 writes the grow id here, once per new rank */
  int nonblock; /* the parent is nonblocking, the grow inherits it */
  int cuda;     /* CUDA communicators (emulated or real) */
};

/* ncclInProgress from a nonblocking communicator: wait for its state. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  for (double t0 = now_s(); r == ncclInProgress && now_s() - t0 < 60;)
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess)
      return ncclInternalError;
  return r;
}

/* An AllReduce on comm, rank r giving r + 1, sums to n(n+1)/2. */
static int sums_right(ncclComm_t comm) {
  int n = 0, rank = -1;
  RCHECK(comm, ncclCommCount(comm, &n));
  RCHECK(comm, ncclCommUserRank(comm, &rank));
  float *d = tbuf_alloc(comm, 256 * sizeof(float)), h[256];
  RASSERT(d != NULL, "no buffer");
  for (int i = 0; i < 256; i++)
    h[i] = (float)(rank + 1);
  RASSERT(tbuf_put(comm, d, h, sizeof h) == 0, "copy in");
  RCHECK(comm, tbuf_result(comm, settle(comm, ncclAllReduce(d, d, 256, ncclFloat, ncclSum, comm, NULL))));
  RASSERT(tbuf_get(comm, h, d, sizeof h) == 0, "copy out");
  for (int i = 0; i < 256; i++)
    RASSERT(h[i] == (float)(n * (n + 1) / 2), "rank %d of %d: element %d is %g", rank, n, i, h[i]);
  tbuf_free(d);
  return 0;
}

static int grow_rank(int rank, int n, ncclUniqueId id, void *argp) {
  struct grow_arg *arg = argp;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = arg->nonblock ? 0 : 1;
  ncclComm_t grown = NULL;
  if (rank >= OLD_N) { /* a new rank */
    close(arg->fd[1]);
    ncclUniqueId gid;
    RASSERT(harness_read_all(arg->fd[0], &gid, sizeof gid) == 0, "rank %d: no grow id from rank 0", rank);
    RCHECK(NULL, ncclCommGrow(NULL, n, &gid, rank, &grown, NULL));
  } else {
    close(arg->fd[0]);
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRankConfig(&comm, OLD_N, id, rank, &config);
    RCHECK(NULL, settle(comm, r));
    ncclUniqueId gid;
    if (rank == 0) {
      RCHECK(comm, ncclCommGetUniqueId(comm, &gid));
      ncclUniqueId again;
      r = ncclCommGetUniqueId(comm, &again);
      RASSERT(r == ncclInvalidUsage && strstr(ncclGetLastError(comm), "not consumed") != NULL,
              "a second id while one is pending: %d: %s", (int)r, ncclGetLastError(comm));
      for (int k = OLD_N; k < n; k++)
        RASSERT(harness_write_all(arg->fd[1], &gid, sizeof gid) == 0, "handing out the id");
    }
    close(arg->fd[1]);
    r = ncclCommGrow(comm, n, rank == 0 ? &gid : NULL, -1, &grown, NULL);
    RASSERT(r == (arg->nonblock ? ncclInProgress : ncclSuccess), "rank %d: ncclCommGrow returned %d: %s", rank,
            (int)r, ncclGetLastError(comm));
    RCHECK(grown, settle(grown, r));
    if (rank == 0) { /* the id is spent */
      ncclComm_t again = NULL;
      r = ncclCommGrow(comm, n, &gid, -1, &again, NULL);
      RASSERT(r == ncclInvalidUsage && again == NULL && strstr(ncclGetLastError(comm), "unconsumed") != NULL,
              "a spent id: %d: %s", (int)r, ncclGetLastError(comm));
    }
    /* The old communicator is untouched: NCCL leaves it to the caller. */
    if (sums_right(comm))
      return 1;
    RCHECK(comm, ncclCommDestroy(comm));
  }
  int count = 0, me = -1, dev = -2;
  RCHECK(grown, ncclCommCount(grown, &count));
  RCHECK(grown, ncclCommUserRank(grown, &me));
  RCHECK(grown, ncclCommCuDevice(grown, &dev));
  RASSERT(count == n && me == rank, "rank %d: the grown communicator says rank %d of %d", rank, me, count);
  RASSERT((dev >= 0) == (arg->cuda != 0), "rank %d: device %d", rank, dev);
  if (sums_right(grown))
    return 1;
  RCHECK(grown, ncclCommDestroy(grown));
  return 0;
}

static int run_grow(int n, int nonblock, int cuda) {
  struct grow_arg arg = {.nonblock = nonblock, .cuda = cuda};
  ASSERT(pipe(arg.fd) == 0);
  int rc = run_ranks(n, grow_rank, &arg);
  close(arg.fd[0]);
  close(arg.fd[1]);
  return rc;
}

TEST_IMPL(grow_2_to_3) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_grow(3, 0, 0);
}

TEST_IMPL(grow_2_to_4) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_grow(4, 0, 0);
}

TEST_IMPL(grow_inherits_nonblocking) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_grow(3, 1, 0);
}

#if LOOM_TEST_CUDA
TEST_IMPL(gpu_grow_2_to_3) {
  NEED_GPU();
  return run_grow(3, 0, 1);
}
#else
NO_CUDA(gpu_grow_2_to_3)
#endif

/* Existing ranks that disagree: both pass an id, none does, or their
 * nRanks differ. Every rank fails with the same sentence and gets no
 * communicator; an id passed is spent, one not passed stays pending. */
static int expect_refused(ncclComm_t comm, ncclResult_t r, const ncclComm_t *grown, const char *what) {
  RASSERT(r == ncclInvalidUsage && *grown == NULL, "%s: returned %d", what, (int)r);
  RASSERT(strstr(ncclGetLastError(comm), what) != NULL, "expected \"%s\" in: %s", what, ncclGetLastError(comm));
  return 0;
}

static int disagree_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm, grown = (ncclComm_t)&grown;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  ncclUniqueId gid;
  /* Both made one and both pass it. */
  RCHECK(comm, ncclCommGetUniqueId(comm, &gid));
  if (expect_refused(comm, ncclCommGrow(comm, 3, &gid, -1, &grown, NULL), &grown, "both pass a grow id"))
    return 1;
  /* Spent: a new one may be made. Rank 0 makes it, nobody passes it. */
  if (rank == 0)
    RCHECK(comm, ncclCommGetUniqueId(comm, &gid));
  grown = (ncclComm_t)&grown;
  if (expect_refused(comm, ncclCommGrow(comm, 3, NULL, -1, &grown, NULL), &grown, "rank 0 made one"))
    return 1;
  /* Not spent (rank 0 did not pass it); the sizes differ. */
  if (rank == 0) {
    ncclUniqueId again;
    RASSERT(ncclCommGetUniqueId(comm, &again) == ncclInvalidUsage, "the unpassed id was spent");
  }
  grown = (ncclComm_t)&grown;
  if (expect_refused(comm, ncclCommGrow(comm, 3 + rank, rank == 0 ? &gid : NULL, -1, &grown, NULL), &grown,
                     "passes nRanks"))
    return 1;
  if (sums_right(comm))
    return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(grow_disagree) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, disagree_rank, NULL);
}

/* Refused with `code` and a sentence holding `words`. */
#define REFUSED(call, code, words)                                                                        \
  do {                                                                                                    \
    ncclResult_t r_ = (call);                                                                             \
    ASSERT_MSG(r_ == (code), "%s returned %d: %s", #call, (int)r_, ncclGetLastError(NULL));               \
    ASSERT_MSG(strstr(ncclGetLastError(NULL), words) != NULL, "%s: expected \"%s\" in: %s", #call, words, \
               ncclGetLastError(NULL));                                                                   \
  } while (0)

TEST_IMPL(grow_bad_args) {
  setenv("LOOM_DEVICE", "host", 1);
  ncclComm_t comm, nc = NULL;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  ncclUniqueId id, plain;
  ASSERT_OK(ncclGetUniqueId(&plain));
  REFUSED(ncclCommGetUniqueId(NULL, &id), ncclInvalidArgument, "comm is NULL");
  REFUSED(ncclCommGetUniqueId(comm, NULL), ncclInvalidArgument, "uniqueId is NULL");
  ASSERT_OK(ncclCommGetUniqueId(comm, &id));
  REFUSED(ncclCommGetUniqueId(comm, &plain), ncclInvalidUsage, "not consumed");
  /* Existing rank. A refused grow leaves *newcomm NULL. */
  nc = (ncclComm_t)&nc;
  REFUSED(ncclCommGrow(comm, 2, &id, -1, NULL, NULL), ncclInvalidArgument, "newcomm is NULL");
  REFUSED(ncclCommGrow(comm, 1, &id, -1, &nc, NULL), ncclInvalidArgument, "nRanks is 1; it must be larger than 1");
  ASSERT(nc == NULL);
  REFUSED(ncclCommGrow(comm, 2, &id, 0, &nc, NULL), ncclInvalidArgument, "rank is 0 with a communicator");
  REFUSED(ncclCommGrow(comm, 2, &plain, -1, &nc, NULL), ncclInvalidUsage, "unconsumed grow id");
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  REFUSED(ncclCommGrow(comm, 2, &id, -1, &nc, &bad), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");
  ASSERT_OK(ncclGroupStart());
  REFUSED(ncclCommGrow(comm, 2, &id, -1, &nc, NULL), ncclInvalidUsage, "inside ncclGroupStart");
  ASSERT_OK(ncclGroupEnd());
  /* New rank. */
  nc = (ncclComm_t)&nc;
  REFUSED(ncclCommGrow(NULL, 2, NULL, 1, &nc, NULL), ncclInvalidArgument, "uniqueId is NULL with comm NULL");
  REFUSED(ncclCommGrow(NULL, 2, &plain, 1, &nc, NULL), ncclInvalidArgument, "not made by ncclCommGetUniqueId");
  REFUSED(ncclCommGrow(NULL, 1, &id, 1, &nc, NULL), ncclInvalidArgument, "larger than 1");
  REFUSED(ncclCommGrow(NULL, 3, &id, -1, &nc, NULL), ncclInvalidArgument, "rank is -1 with comm NULL");
  REFUSED(ncclCommGrow(NULL, 3, &id, 0, &nc, NULL), ncclInvalidArgument, "rank 0 is not one of the new ranks 1 to 2");
  REFUSED(ncclCommGrow(NULL, 3, &id, 3, &nc, NULL), ncclInvalidArgument, "rank 3 is not one of the new ranks");
  REFUSED(ncclCommGrow(NULL, 3, &id, 1, NULL, NULL), ncclInvalidArgument, "newcomm is NULL");
  ASSERT(nc == NULL);
  /* None of it changed the communicator, nor spent the id. */
  int32_t one = 1;
  ASSERT_OK(ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, NULL));
  ASSERT(one == 1);
  REFUSED(ncclCommGetUniqueId(comm, &plain), ncclInvalidUsage, "not consumed");
  /* A finalized, a revoked, a destroyed communicator. */
  ASSERT_OK(ncclCommFinalize(comm));
  REFUSED(ncclCommGetUniqueId(comm, &id), ncclInvalidUsage, "finalized");
  REFUSED(ncclCommGrow(comm, 2, NULL, -1, &nc, NULL), ncclInvalidUsage, "finalized");
  ASSERT_OK(ncclCommDestroy(comm));
  REFUSED(ncclCommGetUniqueId(comm, &id), ncclInvalidArgument, "not a communicator");
  REFUSED(ncclCommGrow(comm, 2, NULL, -1, &nc, NULL), ncclInvalidArgument, "not a communicator");
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  ASSERT_OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  REFUSED(ncclCommGetUniqueId(comm, &id), ncclInvalidUsage, "revoked");
  REFUSED(ncclCommGrow(comm, 2, NULL, -1, &nc, NULL), ncclInvalidUsage, "revoked");
  ASSERT(nc == NULL);
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}
