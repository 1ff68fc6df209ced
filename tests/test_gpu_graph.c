/*
 * CUDA graphs: collectives captured once and replayed many times, each
 * replay on new data, with ordinary calls between the replays. The
 * kernels keep each connection's slot count themselves, so a replay goes
 * on from where the last launch, captured or not, stopped; a count kept
 * by the host would make the second replay reuse slots long spent (a
 * mismatch or a hang). Without a device (and outside the emulated build)
 * every test skips.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"
#include "harness.h"
#include "nccl.h"
#include "test.h"

#if LOOM_TEST_CUDA

enum { N = 4099, K = 10, M = 257, REPLAYS = 20 };

/* What every element j of x holds, summed over the ranks, at replay i:
 * rank r puts (r + 1) * i + j % 7 there. */
static float sum_at(int n, int i, int j) { return (float)(i * n * (n + 1) / 2 + n * (j % 7)); }

static int check(const float *got, int count, float times, int n, int i, const char *what) {
  for (int j = 0; j < count; j++)
    RASSERT(got[j] == times * sum_at(n, i, j), "replay %d: %s[%d] is %g, not %g", i, what, j, (double)got[j],
            (double)(times * sum_at(n, i, j)));
  return 0;
}

/* The graph: an AllReduce in place (its plan in the kernel's parameters),
 * then a group of K AllReduces of slices (a plan too big for them, which
 * the graph keeps in device memory of its own), then a send of the sum
 * to the next rank and a receive from the previous one. The first call
 * connects the ring inside the capture. */
static int graph_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float *x, *z, *w, *v, *hin, *hout;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc((void **)&x, N * sizeof *x));
  CUDA_OK(cudaMalloc((void **)&z, K * M * sizeof *z));
  CUDA_OK(cudaMalloc((void **)&w, N * sizeof *w));
  CUDA_OK(cudaMalloc((void **)&v, N * sizeof *v));
  CUDA_OK(cudaMallocHost((void **)&hin, N * sizeof *hin));
  CUDA_OK(cudaMallocHost((void **)&hout, N * sizeof *hout));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  RCHECK(comm, ncclAllReduce(x, x, N, ncclFloat, ncclSum, comm, s));
  RCHECK(comm, ncclGroupStart());
  for (int k = 0; k < K; k++)
    RCHECK(comm, ncclAllReduce(x + k * M, z + k * M, M, ncclFloat, ncclSum, comm, s));
  RCHECK(comm, ncclGroupEnd());
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclSend(x, N, ncclFloat, (rank + 1) % n, comm, s));
  RCHECK(comm, ncclRecv(v, N, ncclFloat, (rank + n - 1) % n, comm, s));
  RCHECK(comm, ncclGroupEnd());
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (int i = 1; i <= REPLAYS; i++) {
    for (int j = 0; j < N; j++)
      hin[j] = (float)((rank + 1) * i + j % 7);
    CUDA_OK(cudaMemcpyAsync(x, hin, N * sizeof *x, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaGraphLaunch(exec, s));
    /* An ordinary call between replays goes on from the same counts. */
    RCHECK(comm, ncclAllReduce(x, w, N, ncclFloat, ncclSum, comm, s));
    CUDA_OK(cudaMemcpyAsync(hout, z, K * M * sizeof *z, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    if (check(hout, K * M, (float)n, n, i, "z"))
      return 1;
    CUDA_OK(cudaMemcpyAsync(hout, w, N * sizeof *w, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    if (check(hout, N, (float)n, n, i, "w"))
      return 1;
    CUDA_OK(cudaMemcpyAsync(hout, v, N * sizeof *v, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    if (check(hout, N, 1.0f, n, i, "v"))
      return 1;
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  RCHECK(comm, ncclCommDestroy(comm));
  cudaFree(x);
  cudaFree(z);
  cudaFree(w);
  cudaFree(v);
  cudaFreeHost(hin);
  cudaFreeHost(hout);
  cudaStreamDestroy(s);
  return 0;
}

/* Through CUDA IPC (p2p), the kernels' counts in device memory. */
TEST_IMPL(gpu_graph_replay_2) {
  NEED_GPU();
  return run_ranks(2, graph_rank, NULL);
}
TEST_IMPL(gpu_graph_replay_3) {
  NEED_GPU();
  return run_ranks(3, graph_rank, NULL);
}
/* Through pinned shared memory, the counts being the FIFOs' own. */
TEST_IMPL(gpu_graph_replay_shm_2) {
  NEED_GPU();
  setenv("NCCL_P2P_DISABLE", "1", 1);
  return run_ranks(2, graph_rank, NULL);
}
/* Through sockets: the proxy follows the counts the kernels write. */
TEST_IMPL(gpu_graph_replay_socket_2) {
  NEED_GPU();
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  return run_ranks(2, graph_rank, NULL);
}

/* A capture that an earlier call invalidated is refused with a sentence,
 * nothing queued, and the communicator works on. */
TEST_IMPL(gpu_graph_invalidated) {
  NEED_GPU();
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  float *d;
  cudaStream_t s;
  ASSERT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  ASSERT(cudaMalloc((void **)&d, 4096) == cudaSuccess);
  ASSERT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  /* Not allowed on a capturing stream: it ends the capture's validity. */
  ASSERT(cudaStreamSynchronize(s) != cudaSuccess);
  ncclResult_t r = ncclAllReduce(d, d, 1024, ncclFloat, ncclSum, comm, s);
  cudaGraph_t graph = NULL;
  ASSERT(cudaStreamEndCapture(s, &graph) != cudaSuccess);
  cudaGetLastError();
  ASSERT_MSG(r == ncclInvalidUsage, "ncclAllReduce on an invalidated capture returned %d", r);
  ASSERT_MSG(strstr(ncclGetLastError(comm), "invalidated") != NULL, "%s", ncclGetLastError(comm));
  ASSERT_OK(ncclAllReduce(d, d, 1024, ncclFloat, ncclSum, comm, s));
  ASSERT(cudaStreamSynchronize(s) == cudaSuccess);
  ASSERT_OK(ncclCommDestroy(comm));
  cudaFree(d);
  return 0;
}

#else

NO_CUDA(gpu_graph_replay_2)
NO_CUDA(gpu_graph_replay_3)
NO_CUDA(gpu_graph_replay_shm_2)
NO_CUDA(gpu_graph_replay_socket_2)
NO_CUDA(gpu_graph_invalidated)

#endif
