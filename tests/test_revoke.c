/*
 * ncclCommRevoke: it stops what is in flight (a nonblocking
 * communicator's collective that a peer never joins, a CUDA kernel
 * waiting on one), refuses every later call but split, shrink, destroy
 * and abort with a sentence, and the ranks go on with a split or a
 * shrink of the revoked communicator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_test.h"
#include "harness.h"
#include "nccl.h"
#include "test.h"

/* Far under LOOM_TIMEOUT (set to 120 s): what stops the call is the
 * revoke, not the timeout. */
#define BOUND_S 20.0

static int refused_revoked(ncclComm_t comm, ncclResult_t r, const char *call) {
  RASSERT(r == ncclInvalidUsage, "%s on a revoked communicator returned %d", call, (int)r);
  RASSERT(strstr(ncclGetLastError(comm), "revoked") != NULL, "%s: %s", call, ncclGetLastError(comm));
  return 0;
}

/* The child's AllReduce is right: rank r gives r + 1. */
static int child_works(ncclComm_t child) {
  int n = 0, rank = -1;
  RCHECK(child, ncclCommCount(child, &n));
  RCHECK(child, ncclCommUserRank(child, &rank));
  float *d = tbuf_alloc(child, 64 * sizeof(float)), h[64];
  for (int i = 0; i < 64; i++)
    h[i] = (float)(rank + 1);
  RASSERT(tbuf_put(child, d, h, sizeof h) == 0, "copy in");
  RCHECK(child, tbuf_result(child, ncclAllReduce(d, d, 64, ncclFloat, ncclSum, child, NULL)));
  RASSERT(tbuf_get(child, h, d, sizeof h) == 0, "copy out");
  for (int i = 0; i < 64; i++)
    RASSERT(h[i] == (float)(n * (n + 1) / 2), "element %d is %g", i, h[i]);
  tbuf_free(d);
  return 0;
}

/* Revoke after working calls: later calls refused, revoking twice fine,
 * then a shrink and a split of the revoked communicator both work. */
static int after_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float x[16] = {0};
  RCHECK(comm, ncclAllReduce(x, x, 16, ncclFloat, ncclSum, comm, NULL));
  RCHECK(comm, ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  if (refused_revoked(comm, ncclAllReduce(x, x, 16, ncclFloat, ncclSum, comm, NULL), "ncclAllReduce") ||
      refused_revoked(comm, ncclSend(x, 1, ncclFloat, 0, comm, NULL), "ncclSend") ||
      refused_revoked(comm, ncclCommFinalize(comm), "ncclCommFinalize"))
    return 1;
  RCHECK(comm, ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  ncclComm_t shrunk = NULL, split = NULL;
  RCHECK(comm, ncclCommShrink(comm, NULL, 0, &shrunk, NULL, NCCL_SHRINK_DEFAULT));
  RCHECK(comm, ncclCommSplit(comm, rank % 2, rank, &split, NULL));
  if (child_works(shrunk) || child_works(split))
    return 1;
  RCHECK(shrunk, ncclCommDestroy(shrunk));
  RCHECK(split, ncclCommDestroy(split));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(revoke_then_shrink) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(3, after_rank, NULL);
}

/* A nonblocking communicator's AllReduce on rank 0 that rank 1 never
 * joins: rank 0's revoke stops it, and both ranks split to go on. */
static int inflight_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  setenv("LOOM_TIMEOUT", "120", 1);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &config);
  RASSERT(r == ncclSuccess || r == ncclInProgress, "init returned %d", (int)r);
  ncclResult_t st = ncclInProgress;
  for (double t0 = now_s(); st == ncclInProgress && now_s() - t0 < BOUND_S;)
    RCHECK(comm, ncclCommGetAsyncError(comm, &st));
  RASSERT(st == ncclSuccess, "init ended as %d", (int)st);
  static float x[1 << 16];
  if (rank == 0) {
    r = ncclAllReduce(x, x, 1 << 16, ncclFloat, ncclSum, comm, NULL);
    RASSERT(r == ncclInProgress, "the AllReduce returned %d", (int)r);
    RCHECK(comm, ncclCommGetAsyncError(comm, &st));
    RASSERT(st == ncclInProgress, "the AllReduce rank 1 never joins is not in flight (state %d)", (int)st);
  }
  double t0 = now_s();
  RCHECK(comm, ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  double took = now_s() - t0;
  RASSERT(took < BOUND_S, "rank %d: ncclCommRevoke took %.1f s", rank, took);
  RCHECK(comm, ncclCommGetAsyncError(comm, &st));
  RASSERT(st != ncclInProgress, "rank %d: still in progress after ncclCommRevoke returned", rank);
  ncclComm_t child = NULL;
  r = ncclCommSplit(comm, 0, rank, &child, NULL);
  st = r;
  for (double t1 = now_s(); st == ncclInProgress && now_s() - t1 < BOUND_S;)
    RCHECK(child, ncclCommGetAsyncError(child, &st));
  RASSERT(st == ncclSuccess, "rank %d: the split of the revoked communicator ended as %d: %s", rank, (int)st,
          ncclGetLastError(comm));
  RCHECK(comm, ncclCommDestroy(comm));
  RCHECK(child, ncclCommDestroy(child));
  return 0;
}

TEST_IMPL(revoke_nonblocking_inflight) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(2, inflight_rank, NULL);
}

TEST_IMPL(revoke_bad_args) {
  setenv("LOOM_DEVICE", "host", 1);
  ASSERT(ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT) == ncclInvalidArgument);
  ASSERT(strstr(ncclGetLastError(NULL), "comm is NULL") != NULL);
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  ASSERT(ncclCommRevoke(comm, 1) == ncclInvalidArgument);
  ASSERT(strstr(ncclGetLastError(comm), "NCCL_REVOKE_DEFAULT") != NULL);
  int32_t one = 1;
  ASSERT_OK(ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, NULL)); /* refused flags changed nothing */
  ASSERT_OK(ncclCommFinalize(comm));
  ASSERT(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) == ncclInvalidUsage);
  ASSERT(strstr(ncclGetLastError(comm), "finalized") != NULL);
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

#if LOOM_TEST_CUDA
/* A CUDA kernel waiting on rank 1, which never calls: rank 0's revoke
 * stops the kernel (its stream completes), and both ranks split. */
static int kernel_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  CUDA_OK(cudaSetDevice(0));
  setenv("LOOM_TIMEOUT", "120", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *d;
  CUDA_OK(cudaMalloc((void **)&d, (1 << 16) * sizeof(float)));
  if (rank == 0) {
    RCHECK(comm, ncclAllReduce(d, d, 1 << 16, ncclFloat, ncclSum, comm, NULL));
    RASSERT(cudaStreamQuery(NULL) == cudaErrorNotReady, "the kernel rank 1 never joins is not running");
  }
  double t0 = now_s();
  RCHECK(comm, ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  CUDA_OK(cudaStreamSynchronize(NULL));
  RASSERT(now_s() - t0 < BOUND_S, "rank %d: the revoke and the stream took %.1f s", rank, now_s() - t0);
  ncclComm_t child = NULL;
  RCHECK(comm, ncclCommSplit(comm, 0, rank, &child, NULL));
  if (child_works(child))
    return 1;
  RCHECK(child, ncclCommDestroy(child));
  RCHECK(comm, ncclCommDestroy(comm));
  CUDA_OK(cudaFree(d));
  return 0;
}

TEST_IMPL(gpu_revoke_kernel) {
  NEED_GPU();
  return run_ranks(2, kernel_rank, NULL);
}
#else
NO_CUDA(gpu_revoke_kernel)
#endif
