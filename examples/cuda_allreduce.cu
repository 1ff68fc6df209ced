/*
 * The usage NCCL's documentation teaches, as a CUDA C program: pick the
 * device, allocate device buffers, fill them with our own kernel, enqueue
 * ncclAllReduce on the same stream behind it, copy the result back on that
 * stream too, and synchronise once. Nothing waits in between: the stream
 * orders the kernel, the collective and the copy.
 *
 *   cuda_allreduce --ranks 2 [--count 1048576]
 *
 * One rank per process, forked by the example itself; rank r uses device
 * r % (number of devices), so with one GPU all ranks share it (Loom
 * allows several ranks of a communicator on one GPU; NCCL refuses that).
 * Without a CUDA device it says "no CUDA device" and exits 77, the status
 * CTest counts as skipped.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ranks.h"

#define CUDA_CHECK(call)                                                                     \
  do {                                                                                       \
    cudaError_t cuda_err_ = (call);                                                          \
    if (cuda_err_ != cudaSuccess) {                                                          \
      fprintf(stderr, "rank %d: %s failed at %s:%d: %s\n", ex_rank, #call, __FILE__, __LINE__, \
              cudaGetErrorString(cuda_err_));                                                \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

struct ca_opts {
  int ranks, count, timeout;
};

/* Rank r puts (r + 1) * (i % 1000 + 1) at index i, so element i of the sum
 * is (i % 1000 + 1) * n (n + 1) / 2: small integers, exact in float for
 * any rank count a host runs. */
__global__ void fill(float *buf, size_t count, int rank)
{
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    buf[i] = (float)(rank + 1) * (float)(i % 1000 + 1);
}

static int rank_main(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  const struct ca_opts *o = (const struct ca_opts *)arg;
  int ndev = 0;
  cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    if (rank == 0)
      printf("cuda_allreduce: no CUDA device (%s); skipped\n",
             err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found none");
    return EX_SKIP;
  }
  /* The device first: the communicator is made on the current device. */
  CUDA_CHECK(cudaSetDevice(rank % ndev));
  ncclComm_t comm;
  EX_NCCL(NULL, ncclCommInitRank(&comm, nranks, *id, rank));

  const size_t count = (size_t)o->count, bytes = count * sizeof(float);
  cudaStream_t stream;
  float *sendbuf, *recvbuf, *host;
  CUDA_CHECK(cudaStreamCreate(&stream));
  CUDA_CHECK(cudaMalloc((void **)&sendbuf, bytes));
  CUDA_CHECK(cudaMalloc((void **)&recvbuf, bytes));
  /* Pinned, so that the copy back is asynchronous like the rest. */
  CUDA_CHECK(cudaMallocHost((void **)&host, bytes));

  double t0 = ex_now();
  fill<<<256, 256, 0, stream>>>(sendbuf, count, rank);
  CUDA_CHECK(cudaGetLastError());
  EX_NCCL(comm, ncclAllReduce(sendbuf, recvbuf, count, ncclFloat, ncclSum, comm, stream));
  CUDA_CHECK(cudaMemcpyAsync(host, recvbuf, bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  double elapsed = ex_now() - t0;

  const double ranks_sum = (double)nranks * (nranks + 1) / 2.0;
  size_t wrong = 0, first_wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float want = (float)((double)(i % 1000 + 1) * ranks_sum);
    if (host[i] != want && wrong++ == 0)
      first_wrong = i;
  }
  int dev = -1;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (wrong)
    printf("rank %d (device %d): %zu of %zu elements wrong, first at %zu: %g instead of %g\n", rank, dev, wrong,
           count, first_wrong, host[first_wrong], (double)(first_wrong % 1000 + 1) * ranks_sum);
  else
    printf("rank %d (device %d): kernel, ncclAllReduce of %zu floats and copy back in %.3f ms (first call, "
           "includes connection setup); result correct\n", rank, dev, count, 1e3 * elapsed);

  EX_NCCL(comm, ncclCommDestroy(comm));
  CUDA_CHECK(cudaFreeHost(host));
  CUDA_CHECK(cudaFree(recvbuf));
  CUDA_CHECK(cudaFree(sendbuf));
  CUDA_CHECK(cudaStreamDestroy(stream));
  return wrong ? 1 : 0;
}

int main(int argc, char **argv)
{
  struct ca_opts o = {2, 1 << 20, 120};
  const ex_opt opts[] = {
      {"ranks", EX_OPT_INT, &o.ranks, "number of ranks (processes), all on this host's GPUs"},
      {"count", EX_OPT_INT, &o.count, "floats to AllReduce"},
      {"timeout", EX_OPT_INT, &o.timeout, "seconds each rank may run"},
      {NULL, EX_OPT_INT, NULL, NULL}};
  ex_parse_args(argc, argv, "ncclAllReduce on device buffers a kernel filled, on one CUDA stream.", opts);
  if (o.ranks < 1 || o.count < 1 || o.timeout < 1) {
    fprintf(stderr, "%s: need ranks >= 1, count >= 1, timeout >= 1\n", argv[0]);
    return 2;
  }
  /* LOOM_DEVICE=host would make host communicators, which cannot take
   * device buffers; the host examples set it, this one must not inherit it. */
  const char *device = getenv("LOOM_DEVICE");
  if (device && strcmp(device, "host") == 0) {
    printf("cuda_allreduce: ignoring LOOM_DEVICE=host: this example needs CUDA communicators\n");
    unsetenv("LOOM_DEVICE");
  }
  /* No CUDA call before the fork: each rank initialises CUDA itself. */
  int rc = ex_run_ranks("cuda_allreduce", o.ranks, (unsigned)o.timeout, rank_main, &o);
  if (rc == 0)
    printf("cuda_allreduce: AGREE: all %d ranks got the exact sum on the device\n", o.ranks);
  return rc;
}
