/*
 * The LL protocol (kernel_ll.cuh) on CUDA communicators: the collective
 * matrix forced onto LL (NCCL_PROTO=LL) over p2p and shm, with trees;
 * Simple and LL calls taking turns on the same connections around the
 * 64 KiB switch; mismatched calls under LL (and across the switch) found
 * and reported, not hung; LL collectives in a replayed CUDA graph.
 * Without a device (and outside the emulated build) every test skips.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_matrix.h"
#include "gpu_test.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

#if LOOM_TEST_CUDA

/* Small enough that the matrix stays quick, large enough that a call
 * spans several LL slots and ring steps. */
#define LL_LARGE "20001"

static int ll_matrix_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int calls = 0;
  if (coll_matrix(comm, rank, n, &calls))
    return 1;
  const char *tr;
  RCHECK(comm, loomCommPeerTransport(comm, (rank + 1) % n, &tr));
  RASSERT(strcmp(tr, getenv("NCCL_P2P_DISABLE") ? "shm" : "p2p") == 0, "rank %d reached its neighbour over %s", rank,
          tr);
  if (rank == 0)
    printf("%d GPU ranks over %s, NCCL_PROTO=%s: %d calls checked\n", n, tr, getenv("NCCL_PROTO"), calls);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int ll_matrix(int n, int shm) {
  setenv("NCCL_PROTO", "LL", 1);
  setenv("LOOM_TEST_LARGE", LL_LARGE, 1);
  if (shm)
    setenv("NCCL_P2P_DISABLE", "1", 1);
  return run_ranks(n, ll_matrix_rank, NULL);
}

TEST_IMPL(gpu_ll_coll_2) {
  NEED_GPU();
  return ll_matrix(2, 0);
}
TEST_IMPL(gpu_ll_coll_4) {
  NEED_GPU();
  return ll_matrix(4, 0);
}
TEST_IMPL(gpu_ll_coll_shm_2) {
  NEED_GPU();
  return ll_matrix(2, 1);
}
TEST_IMPL(gpu_ll_coll_shm_4) {
  NEED_GPU();
  return ll_matrix(4, 1);
}
/* Trees (AllReduce: a work with up to four connections) under LL. */
TEST_IMPL(gpu_ll_tree_4) {
  NEED_GPU();
  setenv("NCCL_ALGO", "Tree", 1);
  setenv("LOOM_TEST_ALLREDUCE_ONLY", "1", 1);
  return ll_matrix(4, 0);
}

/* Calls of both protocols in turn on the same connections, the default
 * tuner choosing by size: the slot counts must go on across the switch,
 * each way, many times. Rank r puts r + 1 + (j % 13) + i at element j of
 * call i; sums of small integers are exact in float. */
static int alternate_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  static const size_t counts[] = {16384, 16385, 1, 40000, 16000, 16400, 7, 100003, 12288, 24577};
  enum { NC = sizeof counts / sizeof counts[0], ITERS = 6, MAXC = 100003 };
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *in, *out, *h;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc((void **)&in, MAXC * sizeof *in));
  CUDA_OK(cudaMalloc((void **)&out, (size_t)n * MAXC * sizeof *out));
  CUDA_OK(cudaMallocHost((void **)&h, (size_t)n * MAXC * sizeof *h));
  for (int it = 0; it < ITERS; it++)
    for (int c = 0; c < NC; c++) {
      size_t count = counts[c];
      int i = it * NC + c;
      for (size_t j = 0; j < count; j++)
        h[j] = (float)(rank + 1 + (int)(j % 13) + i);
      CUDA_OK(cudaMemcpyAsync(in, h, count * sizeof *h, cudaMemcpyHostToDevice, s));
      /* AllReduce, then AllGather of the same input: two collectives,
       * each chosen by its own size. */
      RCHECK(comm, ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, s));
      CUDA_OK(cudaMemcpyAsync(h, out, count * sizeof *h, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      for (size_t j = 0; j < count; j++) {
        float want = (float)(n * (n + 1) / 2 + n * ((int)(j % 13) + i));
        RASSERT(h[j] == want, "call %d (AllReduce of %zu): [%zu] is %g, not %g", i, count, j, (double)h[j],
                (double)want);
      }
      size_t gcount = count / 4 + 1;
      for (size_t j = 0; j < gcount; j++)
        h[j] = (float)(rank + 1 + (int)(j % 13) + i);
      CUDA_OK(cudaMemcpyAsync(in, h, gcount * sizeof *h, cudaMemcpyHostToDevice, s));
      RCHECK(comm, ncclAllGather(in, out, gcount, ncclFloat, comm, s));
      CUDA_OK(cudaMemcpyAsync(h, out, (size_t)n * gcount * sizeof *h, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      for (int r = 0; r < n; r++)
        for (size_t j = 0; j < gcount; j++) {
          float want = (float)(r + 1 + (int)(j % 13) + i);
          RASSERT(h[(size_t)r * gcount + j] == want, "call %d (AllGather of %zu): rank %d's [%zu] is %g, not %g", i,
                  gcount, r, j, (double)h[(size_t)r * gcount + j], (double)want);
        }
    }
  if (rank == 0)
    printf("%d rounds of %d sizes around 64 KiB checked\n", ITERS, NC);
  RCHECK(comm, ncclCommDestroy(comm));
  cudaFree(in);
  cudaFree(out);
  cudaFreeHost(h);
  cudaStreamDestroy(s);
  return 0;
}

TEST_IMPL(gpu_ll_alternate_2) {
  NEED_GPU();
  unsetenv("NCCL_PROTO");
  return run_ranks(2, alternate_rank, NULL);
}

/* Mismatched calls: the error (a mismatch, or a peer that reported one),
 * named, never a hang or a wrong result taken for success. */
enum { MM_COUNT, MM_COLL, MM_SWITCH };

static int mismatch_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int how = *(const int *)arg;
  CUDA_OK(cudaSetDevice(0));
  setenv("LOOM_TIMEOUT", "10", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *d;
  CUDA_OK(cudaMalloc((void **)&d, 100000 * 4));
  /* A matched call first, so that the mismatch meets connections in use. */
  RCHECK(comm, ncclAllReduce(d, d, 1000, ncclFloat, ncclSum, comm, NULL));
  switch (how) {
  case MM_COUNT: RCHECK(comm, ncclAllReduce(d, d, rank == 0 ? 1000 : 1001, ncclFloat, ncclSum, comm, NULL)); break;
  case MM_COLL:
    if (rank == 0)
      RCHECK(comm, ncclAllReduce(d, d, 1000, ncclFloat, ncclSum, comm, NULL));
    else
      RCHECK(comm, ncclBroadcast(d, d, 1000, ncclFloat, 0, comm, NULL));
    break;
  case MM_SWITCH: /* LL on rank 0 (4 KB), Simple on rank 1 (400 KB) */
    RCHECK(comm, ncclAllReduce(d, d, rank == 0 ? 1000 : 100000, ncclFloat, ncclSum, comm, NULL));
    break;
  }
  cudaDeviceSynchronize();
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 500 && async == ncclSuccess; i++) {
    RCHECK(comm, ncclCommGetAsyncError(comm, &async));
    if (async == ncclSuccess) {
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL); /* polling an asynchronous error, as users do */
    }
  }
  RASSERT(async == ncclInvalidUsage || async == ncclRemoteError, "case %d: async error %d", how, (int)async);
  RASSERT(strstr(ncclGetLastError(comm), "rank") != NULL, "%s", ncclGetLastError(comm));
  if (rank == 0)
    printf("case %d: %s\n", how, ncclGetLastError(comm));
  ncclCommAbort(comm);
  cudaFree(d);
  return 0;
}

TEST_IMPL(gpu_ll_mismatch) {
  NEED_GPU();
  static int how[] = {MM_COUNT, MM_COLL, MM_SWITCH};
  setenv("NCCL_PROTO", "LL", 1);
  if (run_ranks(2, mismatch_rank, &how[0]) || run_ranks(2, mismatch_rank, &how[1]))
    return 1;
  /* Across the switch: one rank's call is LL, the other's Simple. */
  unsetenv("NCCL_PROTO");
  return run_ranks(2, mismatch_rank, &how[2]);
}

/* LL collectives captured in a CUDA graph and replayed, with a Simple
 * call (larger than the switch) and an LL call between replays: each
 * replay must go on from the slot counts the last launch left. */
enum { GN = 4099, GK = 6, GM = 257, GBIG = 40000, REPLAYS = 20 };

static float sum_at(int n, int i, int j) { return (float)(i * n * (n + 1) / 2 + n * (j % 7)); }

static int check(const float *got, int count, float times, int n, int i, const char *what) {
  for (int j = 0; j < count; j++)
    RASSERT(got[j] == times * sum_at(n, i, j), "replay %d: %s[%d] is %g, not %g", i, what, j, (double)got[j],
            (double)(times * sum_at(n, i, j)));
  return 0;
}

static int graph_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *x, *z, *w, *big, *hin, *hbig, *hout;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc((void **)&x, GN * sizeof *x));
  CUDA_OK(cudaMalloc((void **)&z, GK * GM * sizeof *z));
  CUDA_OK(cudaMalloc((void **)&w, GN * sizeof *w));
  CUDA_OK(cudaMalloc((void **)&big, GBIG * sizeof *big));
  CUDA_OK(cudaMallocHost((void **)&hin, GBIG * sizeof *hin));
  CUDA_OK(cudaMallocHost((void **)&hbig, GBIG * sizeof *hbig));
  CUDA_OK(cudaMallocHost((void **)&hout, GBIG * sizeof *hout));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  RCHECK(comm, ncclAllReduce(x, x, GN, ncclFloat, ncclSum, comm, s));
  RCHECK(comm, ncclGroupStart());
  for (int k = 0; k < GK; k++)
    RCHECK(comm, ncclAllReduce(x + k * GM, z + k * GM, GM, ncclFloat, ncclSum, comm, s));
  RCHECK(comm, ncclGroupEnd());
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (int i = 1; i <= REPLAYS; i++) {
    for (int j = 0; j < GN; j++)
      hin[j] = (float)((rank + 1) * i + j % 7);
    for (int j = 0; j < GBIG; j++)
      hbig[j] = (float)(rank + 1 + j % 5);
    CUDA_OK(cudaMemcpyAsync(x, hin, GN * sizeof *x, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(big, hbig, GBIG * sizeof *big, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaGraphLaunch(exec, s));
    /* Ordinary calls between replays, Simple (160 KB) then LL. */
    RCHECK(comm, ncclAllReduce(big, big, GBIG, ncclFloat, ncclSum, comm, s));
    RCHECK(comm, ncclAllReduce(x, w, GN, ncclFloat, ncclSum, comm, s));
    CUDA_OK(cudaMemcpyAsync(hout, z, GK * GM * sizeof *z, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    if (check(hout, GK * GM, (float)n, n, i, "z"))
      return 1;
    CUDA_OK(cudaMemcpyAsync(hout, w, GN * sizeof *w, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    if (check(hout, GN, (float)n, n, i, "w"))
      return 1;
    CUDA_OK(cudaMemcpyAsync(hout, big, GBIG * sizeof *big, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    for (int j = 0; j < GBIG; j++)
      RASSERT(hout[j] == (float)(n * (n + 1) / 2 + n * (j % 5)), "replay %d: big[%d] is %g", i, j, (double)hout[j]);
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  RCHECK(comm, ncclCommDestroy(comm));
  cudaFree(x);
  cudaFree(z);
  cudaFree(w);
  cudaFree(big);
  cudaFreeHost(hin);
  cudaFreeHost(hbig);
  cudaFreeHost(hout);
  cudaStreamDestroy(s);
  return 0;
}

TEST_IMPL(gpu_graph_replay_ll_2) {
  NEED_GPU();
  unsetenv("NCCL_PROTO");
  return run_ranks(2, graph_rank, NULL);
}

#else

NO_CUDA(gpu_ll_coll_2)
NO_CUDA(gpu_ll_coll_4)
NO_CUDA(gpu_ll_coll_shm_2)
NO_CUDA(gpu_ll_coll_shm_4)
NO_CUDA(gpu_ll_tree_4)
NO_CUDA(gpu_ll_alternate_2)
NO_CUDA(gpu_ll_mismatch)
NO_CUDA(gpu_graph_replay_ll_2)

#endif
