/*
 * CUDA communicators, on a machine with a GPU: the collective matrix on
 * device buffers with 1, 2 and 4 ranks sharing the device (processes),
 * ordering with the stream's other work, groups, ncclCommInitAll on one
 * device, device-resident PreMulSum scalars, and host pointers refused.
 * Without a device every test skips with "no CUDA device".
 */
#include <pthread.h>
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

static int matrix_rank(int rank, int n, ncclUniqueId id, void *arg) {
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int is_host = 1, dev = -2;
  RCHECK(comm, loomCommIsHost(comm, &is_host));
  RCHECK(comm, ncclCommCuDevice(comm, &dev));
  RASSERT(!is_host && dev == 0, "expected a CUDA communicator on device 0 (host %d, device %d)", is_host, dev);
  int calls = 0;
  if (coll_matrix(comm, rank, n, &calls))
    return 1;
  if (n > 1) {
    const char *tr;
    RCHECK(comm, loomCommPeerTransport(comm, (rank + 1) % n, &tr));
    RASSERT(strcmp(tr, getenv("NCCL_P2P_DISABLE") ? "shm" : "p2p") == 0, "rank %d reached its neighbour over %s",
            rank, tr);
    if (rank == 0)
      printf("%d GPU ranks over %s: %d calls checked\n", n, tr, calls);
  }
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(gpu_coll_1) {
  NEED_GPU();
  return run_ranks(1, matrix_rank, NULL);
}
TEST_IMPL(gpu_coll_2) {
  NEED_GPU();
  return run_ranks(2, matrix_rank, NULL);
}
TEST_IMPL(gpu_coll_4) {
  NEED_GPU();
  return run_ranks(4, matrix_rank, NULL);
}
/* Device buffers through pinned host memory instead of IPC. */
TEST_IMPL(gpu_coll_shm_2) {
  NEED_GPU();
  setenv("NCCL_P2P_DISABLE", "1", 1);
  return run_ranks(2, matrix_rank, NULL);
}

/* Many pieces a step: slots of 8 KiB (NCCL_BUFFSIZE 64 KiB), so that the
 * kernel's sync warp prepares piece k+1 while the data warps move piece k
 * (src/exec/cuda/kernel_simple.cuh), across steps and works. Over the
 * tree a rank's piece k+1 from its parent needs its own piece k first:
 * a sync warp that waited for k+1 before publishing k would hang. */
static int pieces_test(int n, const char *algo, int allreduce_only) {
  NEED_GPU();
  setenv("NCCL_BUFFSIZE", "65536", 1);
  setenv("NCCL_ALGO", algo, 1);
  if (allreduce_only)
    setenv("LOOM_TEST_ALLREDUCE_ONLY", "1", 1);
  return run_ranks(n, matrix_rank, NULL);
}
TEST_IMPL(gpu_pieces_tree_4) { return pieces_test(4, "allreduce:tree", 1); }
TEST_IMPL(gpu_pieces_ring_3) { return pieces_test(3, "ring", 0); }

/* The collective runs in stream order: an upload before it, a download and
 * a second collective after it, one synchronisation at the end. */
static int order_rank(int rank, int n, ncclUniqueId id, void *arg) {
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { N = 1 << 20 };
  float *h = malloc(N * sizeof *h), *out, *d;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc((void **)&d, N * sizeof *d));
  CUDA_OK(cudaMallocHost((void **)&out, N * sizeof *out));
  for (int i = 0; i < N; i++)
    h[i] = (float)(rank + 1) * (float)(i % 13);
  CUDA_OK(cudaMemsetAsync(d, 0xff, N * sizeof *d, s));
  CUDA_OK(cudaMemcpyAsync(d, h, N * sizeof *d, cudaMemcpyHostToDevice, s));
  RCHECK(comm, ncclAllReduce(d, d, N, ncclFloat, ncclSum, comm, s));
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclAllReduce(d, d, N, ncclFloat, ncclSum, comm, s)); /* twice the sum, times n */
  RCHECK(comm, ncclBroadcast(d, d, N, ncclFloat, 0, comm, s));
  RCHECK(comm, ncclGroupEnd());
  CUDA_OK(cudaMemcpyAsync(out, d, N * sizeof *d, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  float tri = (float)(n * (n + 1) / 2);
  for (int i = 0; i < N; i++)
    RASSERT(out[i] == tri * (float)n * (float)(i % 13), "element %d is %g", i, out[i]);
  free(h);
  cudaFreeHost(out);
  cudaFree(d);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(gpu_stream_order) {
  NEED_GPU();
  return run_ranks(2, order_rank, NULL);
}

/* A host pointer is refused with a sentence instead of a crash. */
TEST_IMPL(gpu_host_pointer) {
  NEED_GPU();
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  float host[16];
  ASSERT(ncclAllReduce(host, host, 16, ncclFloat, ncclSum, comm, NULL) == ncclInvalidArgument);
  ASSERT_MSG(strstr(ncclGetLastError(comm), "ordinary host memory") != NULL, "%s", ncclGetLastError(comm));
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

/* Ranks of one process on the devices `devs`, driven by one thread. */
static int init_all_run(int R, const int *devs) {
  enum { N = 100003, MAXR = 4 };
  ncclComm_t comms[MAXR];
  ASSERT_OK(ncclCommInitAll(comms, R, devs));
  float *d[MAXR];
  cudaStream_t s[MAXR];
  float *h = malloc(N * 4);
  ASSERT(h != NULL);
  for (int r = 0; r < R; r++) {
    ASSERT(cudaSetDevice(devs[r]) == cudaSuccess);
    ASSERT(cudaStreamCreate(&s[r]) == cudaSuccess && cudaMalloc((void **)&d[r], N * 4) == cudaSuccess);
    for (int i = 0; i < N; i++)
      h[i] = (float)(r + i % 5);
    ASSERT(cudaMemcpy(d[r], h, N * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ASSERT_OK(ncclGroupStart());
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclAllReduce(d[r], d[r], N, ncclFloat, ncclSum, comms[r], s[r]));
  ASSERT_OK(ncclGroupEnd());
  for (int r = 0; r < R; r++) {
    ASSERT(cudaSetDevice(devs[r]) == cudaSuccess);
    ASSERT(cudaStreamSynchronize(s[r]) == cudaSuccess);
    ASSERT(cudaMemcpy(h, d[r], N * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int i = 0; i < N; i++)
      ASSERT_MSG(h[i] == (float)(R * (R - 1) / 2 + R * (i % 5)), "rank %d element %d is %g", r, i, h[i]);
  }
  const char *tr;
  ASSERT_OK(loomCommPeerTransport(comms[0], 1, &tr));
  ASSERT_MSG(strcmp(tr, "p2p") == 0, "ranks 0 and 1 (devices %d and %d) connected over %s", devs[0], devs[1], tr);
  for (int r = 0; r < R; r++)
    ASSERT_OK(ncclCommDestroy(comms[r]));
  free(h);
  return 0;
}

/* Several ranks of one process on one GPU, driven by one thread. */
TEST_IMPL(gpu_init_all_shared) {
  NEED_GPU();
  static const int devs[] = {0, 0, 0};
  return init_all_run(3, devs);
}

/* One rank on each of two GPUs of one process: each writes into the
 * other's memory once peer access is enabled (an illegal address
 * otherwise, which only a real GPU shows). */
TEST_IMPL(gpu_init_all_devices) {
  if (harness_cuda_devices() < 2)
    SKIP("needs two CUDA devices");
  static const int devs[] = {0, 1};
  return init_all_run(2, devs);
}

/* Ranks as threads of one process on one GPU: their kernels run at once,
 * each rank on a stream of its own, as they would not as processes
 * without MPS (time slices). The test's buffers are all allocated before
 * the first call (docs/launching.md says why). */
struct threads_test {
  pthread_barrier_t ready;
};

static int thread_rank(int rank, int n, ncclUniqueId id, void *arg) {
  struct threads_test *tt = arg;
  enum { N = 200003, ROUNDS = 3 };
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *d, *g, *h = malloc(sizeof *h * N * (size_t)n);
  RASSERT(h, "out of memory");
  CUDA_OK(cudaMalloc((void **)&d, sizeof *d * N));
  CUDA_OK(cudaMalloc((void **)&g, sizeof *g * N * (size_t)n));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  pthread_barrier_wait(&tt->ready);
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < N; i++)
      h[i] = (float)(rank + round + i % 11);
    CUDA_OK(cudaMemcpyAsync(d, h, sizeof *h * N, cudaMemcpyHostToDevice, s));
    RCHECK(comm, ncclAllGather(d, g, N, ncclFloat, comm, s));
    RCHECK(comm, ncclAllReduce(d, d, N, ncclFloat, ncclSum, comm, s));
    CUDA_OK(cudaMemcpyAsync(h, d, sizeof *h * N, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++)
      RASSERT(h[i] == (float)(n * (n - 1) / 2 + n * (round + i % 11)), "rank %d round %d: sum %d is %g", rank, round,
              i, h[i]);
    CUDA_OK(cudaMemcpyAsync(h, g, sizeof *h * N * (size_t)n, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    for (int r = 0; r < n; r++)
      for (int i = 0; i < N; i++)
        RASSERT(h[(size_t)r * N + i] == (float)(r + round + i % 11), "rank %d round %d: gathered %d of rank %d is %g",
                rank, round, i, r, h[(size_t)r * N + i]);
  }
  RCHECK(comm, ncclCommDestroy(comm));
  cudaFree(d);
  cudaFree(g);
  cudaStreamDestroy(s);
  free(h);
  return 0;
}

static int threads_run(int n) {
  NEED_GPU();
  struct threads_test tt;
  pthread_barrier_init(&tt.ready, NULL, (unsigned)n);
  int rc = run_rank_threads(n, thread_rank, &tt);
  pthread_barrier_destroy(&tt.ready);
  return rc;
}

TEST_IMPL(gpu_threads_2) { return threads_run(2); }
TEST_IMPL(gpu_threads_4) { return threads_run(4); }

/* ncclScalarDevice: the kernel reads the scalar when the collective runs,
 * so a change queued on the stream before the call is seen. */
static int scalar_rank(int rank, int n, ncclUniqueId id, void *arg) {
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  float *scalar, *buf, two = 2.0f, three = 3.0f, x[64], out[64];
  CUDA_OK(cudaMalloc((void **)&scalar, 4));
  CUDA_OK(cudaMalloc((void **)&buf, sizeof x));
  CUDA_OK(cudaMemcpy(scalar, &two, 4, cudaMemcpyHostToDevice));
  ncclRedOp_t op;
  RCHECK(comm, ncclRedOpCreatePreMulSum(&op, scalar, ncclFloat, ncclScalarDevice, comm));
  for (int i = 0; i < 64; i++)
    x[i] = (float)i;
  CUDA_OK(cudaMemcpyAsync(buf, x, sizeof x, cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaMemcpyAsync(scalar, &three, 4, cudaMemcpyHostToDevice, s));
  RCHECK(comm, ncclAllReduce(buf, buf, 64, ncclFloat, op, comm, s));
  CUDA_OK(cudaMemcpyAsync(out, buf, sizeof out, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  for (int i = 0; i < 64; i++)
    RASSERT(out[i] == 3.0f * (float)n * (float)i, "element %d is %g", i, out[i]);
  RCHECK(comm, ncclRedOpDestroy(op, comm));
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(gpu_premulsum_device_scalar) {
  NEED_GPU();
  return run_ranks(2, scalar_rank, NULL);
}

/* A mismatched call on the GPU surfaces as the communicator's asynchronous
 * error with the sentence naming both calls. */
static int mismatch_rank(int rank, int n, ncclUniqueId id, void *arg) {
  CUDA_OK(cudaSetDevice(0));
  setenv("LOOM_TIMEOUT", "10", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *d;
  CUDA_OK(cudaMalloc((void **)&d, 4096 * 4));
  RCHECK(comm, ncclAllReduce(d, d, rank == 0 ? 1000 : 1001, ncclFloat, ncclSum, comm, NULL));
  cudaDeviceSynchronize();
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 200 && async == ncclSuccess; i++) {
    RCHECK(comm, ncclCommGetAsyncError(comm, &async));
    if (async == ncclSuccess) {
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL); /* polling an asynchronous error, as users do */
    }
  }
  RASSERT(async == ncclInvalidUsage || async == ncclRemoteError, "async error %d", (int)async);
  RASSERT(strstr(ncclGetLastError(comm), "rank") != NULL, "%s", ncclGetLastError(comm));
  ncclCommAbort(comm);
  return 0;
}

TEST_IMPL(gpu_mismatch) {
  NEED_GPU();
  return run_ranks(2, mismatch_rank, NULL);
}

/* ncclMemAlloc on a thread that makes CUDA communicators: device memory
 * that CUDA IPC can share and a collective can use; ncclMemFree frees it
 * once. */
TEST_IMPL(gpu_mem_alloc) {
  NEED_GPU();
  ASSERT(cudaSetDevice(0) == cudaSuccess);
  enum { N = 4096 };
  float *d = NULL;
  ASSERT_OK(ncclMemAlloc((void **)&d, N * sizeof(float)));
  struct cudaPointerAttributes a;
  ASSERT(cudaPointerGetAttributes(&a, d) == cudaSuccess && GPURT_MEMORY_TYPE(a) == cudaMemoryTypeDevice && a.device == 0);
  cudaIpcMemHandle_t h;
  ASSERT(cudaIpcGetMemHandle(&h, d) == cudaSuccess);
  float x[N], y[N];
  for (int i = 0; i < N; i++)
    x[i] = (float)i;
  ASSERT(cudaMemcpy(d, x, sizeof x, cudaMemcpyHostToDevice) == cudaSuccess);
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  ASSERT_OK(ncclAllReduce(d, d, N, ncclFloat, ncclSum, comm, NULL));
  ASSERT(cudaStreamSynchronize(NULL) == cudaSuccess);
  ASSERT(cudaMemcpy(y, d, sizeof y, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int i = 0; i < N; i++)
    ASSERT_MSG(y[i] == x[i], "element %d is %g", i, y[i]);
  ASSERT_OK(ncclCommDestroy(comm));
  ASSERT_OK(ncclMemFree(d));
  ASSERT(ncclMemFree(d) == ncclInvalidArgument);
  return 0;
}

#else

NO_CUDA(gpu_mem_alloc)
NO_CUDA(gpu_coll_1)
NO_CUDA(gpu_coll_2)
NO_CUDA(gpu_coll_4)
NO_CUDA(gpu_coll_shm_2)
NO_CUDA(gpu_pieces_tree_4)
NO_CUDA(gpu_pieces_ring_3)
NO_CUDA(gpu_stream_order)
NO_CUDA(gpu_host_pointer)
NO_CUDA(gpu_init_all_shared)
NO_CUDA(gpu_init_all_devices)
NO_CUDA(gpu_premulsum_device_scalar)
NO_CUDA(gpu_mismatch)
NO_CUDA(gpu_threads_2)
NO_CUDA(gpu_threads_4)

#endif
