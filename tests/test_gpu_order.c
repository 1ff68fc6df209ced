/*
 * CUDA communicators in stream order: what the host side must get right
 * before a kernel runs (issue 22's first-run defects). Each test holds a
 * stream shut with a gate (a host function that waits until the test opens
 * it), makes its calls, which must only be queued, then opens the gate: a
 * call that does its work at once instead of in stream order reads data
 * not yet there, or runs kernels out of order. Without a device (and
 * outside the emulated build) every test skips.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

#if LOOM_TEST_CUDA

struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
};

static void CUDART_CB gate_wait(void *arg) {
  struct gate *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static int gate_shut(struct gate *g, cudaStream_t s) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = 0;
  CUDA_OK(cudaLaunchHostFunc(s, gate_wait, g));
  return 0;
}

static void gate_open(struct gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* A send to oneself copies what the stream put in the buffer before it,
 * not what was there when the call was made. */
TEST_IMPL(gpu_self_in_order) {
  NEED_GPU();
  enum { N = 300007 };
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  int32_t *h = malloc(N * 4), *out = malloc(N * 4), *src, *dst;
  cudaStream_t s;
  ASSERT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  ASSERT(cudaMalloc((void **)&src, N * 4) == cudaSuccess && cudaMalloc((void **)&dst, N * 4) == cudaSuccess);
  ASSERT(cudaMemset(src, 0, N * 4) == cudaSuccess && cudaMemset(dst, 0, N * 4) == cudaSuccess);
  ASSERT(cudaDeviceSynchronize() == cudaSuccess);
  for (int i = 0; i < N; i++)
    h[i] = i * 7 + 1;
  struct gate g;
  ASSERT(gate_shut(&g, s) == 0);
  ASSERT(cudaMemcpyAsync(src, h, N * 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclSend(src, N, ncclInt32, 0, comm, s));
  ASSERT_OK(ncclRecv(dst, N, ncclInt32, 0, comm, s));
  ASSERT_OK(ncclGroupEnd());
  gate_open(&g);
  ASSERT(cudaStreamSynchronize(s) == cudaSuccess);
  ASSERT(cudaMemcpy(out, dst, N * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int i = 0; i < N; i++)
    ASSERT_MSG(out[i] == i * 7 + 1, "element %d is %d, expected %d", i, out[i], i * 7 + 1);
  /* Buffers that overlap without being the same are refused. */
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclSend(src, 1000, ncclInt32, 0, comm, s));
  ASSERT_OK(ncclRecv(src + 10, 1000, ncclInt32, 0, comm, s));
  ASSERT(ncclGroupEnd() == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(comm), "overlap") != NULL, "%s", ncclGetLastError(comm));
  ASSERT_OK(ncclCommDestroy(comm));
  cudaFree(src);
  cudaFree(dst);
  free(h);
  free(out);
  return 0;
}

/* Two streams: the kernel queued second runs second, whatever the streams
 * do, because the host counted its slots after the first's. */
static int streams_rank(int rank, int n, ncclUniqueId id, void *arg) {
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { N = 200003 };
  float *a, *b, *h = malloc(N * 4);
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc((void **)&a, N * 4));
  CUDA_OK(cudaMalloc((void **)&b, N * 4));
  for (int i = 0; i < N; i++)
    h[i] = (float)(rank + 1);
  CUDA_OK(cudaMemcpy(a, h, N * 4, cudaMemcpyHostToDevice));
  for (int i = 0; i < N; i++)
    h[i] = (float)(10 * (rank + 1));
  CUDA_OK(cudaMemcpy(b, h, N * 4, cudaMemcpyHostToDevice));
  /* Both launches' paths warmed first, so that nothing Loom sets up on
   * the way (an allocation orders every later command after all earlier
   * ones: CUDA's implicit synchronisation) orders the two kernels whatever
   * Loom does. The memset on s1, which the non-blocking streams do not
   * order after the legacy stream. */
  float *warm;
  CUDA_OK(cudaMalloc((void **)&warm, 4 * 1024));
  CUDA_OK(cudaMemsetAsync(warm, 0, 4 * 1024, s1));
  RCHECK(comm, ncclAllReduce(warm, warm, 1024, ncclFloat, ncclSum, comm, s1));
  RCHECK(comm, ncclAllReduce(warm, warm, 1024, ncclFloat, ncclSum, comm, s2));
  CUDA_OK(cudaStreamSynchronize(s1));
  CUDA_OK(cudaStreamSynchronize(s2));
  cudaFree(warm);
  struct gate g;
  RASSERT(gate_shut(&g, s1) == 0, "gate");
  RCHECK(comm, ncclAllReduce(a, a, N, ncclFloat, ncclSum, comm, s1));
  RCHECK(comm, ncclAllReduce(b, b, N, ncclFloat, ncclSum, comm, s2));
  gate_open(&g);
  CUDA_OK(cudaStreamSynchronize(s1));
  CUDA_OK(cudaStreamSynchronize(s2));
  ncclResult_t async = ncclSuccess;
  RCHECK(comm, ncclCommGetAsyncError(comm, &async));
  RASSERT(async == ncclSuccess, "asynchronous error: %s", ncclGetLastError(comm));
  float tri = (float)(n * (n + 1) / 2);
  CUDA_OK(cudaMemcpy(h, a, N * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++)
    RASSERT(h[i] == tri, "first AllReduce: element %d is %g, expected %g", i, h[i], tri);
  CUDA_OK(cudaMemcpy(h, b, N * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++)
    RASSERT(h[i] == 10 * tri, "second AllReduce: element %d is %g, expected %g", i, h[i], 10 * tri);
  RCHECK(comm, ncclCommDestroy(comm));
  cudaFree(a);
  cudaFree(b);
  free(h);
  return 0;
}

TEST_IMPL(gpu_two_streams) {
  NEED_GPU();
  return run_ranks(2, streams_rank, NULL);
}

/* One thread, two communicators on one GPU, and a group big enough that
 * each launch needs more memory than the last: nothing may be freed (an
 * implicit synchronisation) once the first kernel waits for the second. */
TEST_IMPL(gpu_group_grows) {
  NEED_GPU();
  enum { R = 2, CALLS = 150, N = 1031 };
  ncclComm_t comms[R];
  int devs[R] = {0, 0};
  ASSERT_OK(ncclCommInitAll(comms, R, devs));
  float *d[R];
  cudaStream_t s[R];
  float *h = malloc(N * 4 * CALLS);
  for (int r = 0; r < R; r++) {
    ASSERT(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking) == cudaSuccess);
    ASSERT(cudaMalloc((void **)&d[r], (size_t)N * 4 * CALLS) == cudaSuccess);
    for (int i = 0; i < N * CALLS; i++)
      h[i] = (float)(r + 1);
    ASSERT(cudaMemcpy(d[r], h, (size_t)N * 4 * CALLS, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  for (int round = 0; round < 2; round++) {
    int calls = round == 0 ? 1 : CALLS;
    ASSERT_OK(ncclGroupStart());
    for (int r = 0; r < R; r++)
      for (int c = 0; c < calls; c++)
        ASSERT_OK(ncclAllReduce(d[r] + (size_t)c * N, d[r] + (size_t)c * N, N, ncclFloat, ncclSum, comms[r], s[r]));
    ASSERT_OK(ncclGroupEnd());
  }
  for (int r = 0; r < R; r++) {
    ASSERT(cudaStreamSynchronize(s[r]) == cudaSuccess);
    ASSERT(cudaMemcpy(h, d[r], (size_t)N * 4 * CALLS, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int i = 0; i < N * CALLS; i++) {
      float want = i < N ? 6.0f : 3.0f; /* the first call's buffer was reduced twice */
      ASSERT_MSG(h[i] == want, "rank %d element %d is %g, expected %g", r, i, h[i], want);
    }
  }
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclCommDestroy(comms[r]));
  free(h);
  return 0;
}

/* A group whose point-to-point rounds cannot run within what the device
 * holds at once is refused with a sentence on every rank instead of
 * hanging. Only the emulation makes a device that small. */
#if LOOM_TEST_EMU
static int lanes_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *b = tbuf_alloc(comm, sizeof *b * 16 * (size_t)n);
  RASSERT(b, "no buffer");
  RCHECK(comm, ncclGroupStart());
  for (int p = 0; p < n; p++) {
    RCHECK(comm, ncclSend(b + 16 * p, 16, ncclFloat, p, comm, NULL));
    RCHECK(comm, ncclRecv(b + 16 * p, 16, ncclFloat, p, comm, NULL));
  }
  ncclResult_t r = ncclGroupEnd();
  RASSERT(r == ncclInvalidUsage && strstr(ncclGetLastError(comm), "split the group"), "rank %d: %d: %s", rank, (int)r,
          ncclGetLastError(comm));
  RCHECK(NULL, ncclCommDestroy(comm));
  tbuf_free(b);
  return 0;
}
#endif

TEST_IMPL(gpu_lanes_refused) {
#if LOOM_TEST_EMU
  NEED_GPU();
  setenv("LOOM_EMU_RESIDENT", "1", 1);
  return run_ranks(3, lanes_rank, NULL);
#else
  SKIP("needs the emulation, whose device can be made to hold a single block");
#endif
}

#else

NO_CUDA(gpu_lanes_refused)
NO_CUDA(gpu_self_in_order)
NO_CUDA(gpu_two_streams)
NO_CUDA(gpu_group_grows)

#endif
