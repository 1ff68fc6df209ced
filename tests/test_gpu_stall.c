/*
 * The proxy of a CUDA communicator keeps watching while the program
 * allocates memory. After an allocation CUDA starts no command before
 * every command issued earlier has ended (the programming guide's
 * implicit synchronisation), so a proxy that read device memory through
 * a copy it waited for would wait behind a kernel stuck on a dead peer,
 * while the kernel waits for the proxy to stop it: a hang, which the
 * allocator of any framework (PyTorch's among them) would cause. Each
 * test leaves a kernel waiting on a rank that has exited, allocates, and
 * needs the error well before LOOM_TIMEOUT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_test.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

#if LOOM_TEST_CUDA

/* Far above what finding a dead peer takes, far below LOOM_TIMEOUT. */
#define FOUND_WITHIN_S 20.0

static int stall_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const char *want = arg;
  CUDA_OK(cudaSetDevice(0));
  setenv("LOOM_TIMEOUT", "120", 1);
  if (strcmp(want, "p2p") != 0)
    setenv("NCCL_P2P_DISABLE", "1", 1);
  if (strcmp(want, "shm") != 0 && strcmp(want, "p2p") != 0)
    setenv("NCCL_SHM_DISABLE", "1", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  const char *tr;
  RCHECK(comm, loomCommPeerTransport(comm, 1 - rank, &tr));
  RASSERT(strcmp(tr, want) == 0, "rank %d reached its peer over %s, not %s", rank, tr, want);
  enum { N = 4096 };
  float *d;
  CUDA_OK(cudaMalloc((void **)&d, N * sizeof(float)));
  CUDA_OK(cudaMemset(d, 0, N * sizeof(float)));
  RCHECK(comm, ncclAllReduce(d, d, N, ncclFloat, ncclSum, comm, NULL));
  CUDA_OK(cudaDeviceSynchronize());
  if (rank == 1)
    _exit(0); /* gone without a word, in the middle of the job */
  /* Its kernel waits for rank 1 for ever; the program allocates. */
  RCHECK(comm, ncclAllReduce(d, d, N, ncclFloat, ncclSum, comm, NULL));
  void *more, *pinned;
  CUDA_OK(cudaMalloc(&more, 1 << 20));
  CUDA_OK(cudaMallocHost(&pinned, 1 << 16));
  double t0 = now_s();
  ncclResult_t async = ncclSuccess;
  while (async == ncclSuccess && now_s() - t0 < FOUND_WITHIN_S) {
    RCHECK(comm, ncclCommGetAsyncError(comm, &async));
    if (async == ncclSuccess) {
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL); /* polling an asynchronous error, as users do */
    }
  }
  RASSERT(async == ncclRemoteError, "no error %.1f s after the peer exited (async %d)", now_s() - t0, (int)async);
  const char *why = ncclGetLastError(comm);
  RASSERT(strstr(why, "rank 1") && strstr(why, "exited"), "the error does not name the dead rank: %s", why);
  printf("over %s: found in %.2f s: %s\n", want, now_s() - t0, why);
  ncclCommAbort(comm);
  CUDA_OK(cudaFree(more));
  CUDA_OK(cudaFreeHost(pinned));
  CUDA_OK(cudaFree(d));
  return 0;
}

TEST_IMPL(gpu_stall_alloc_p2p) {
  NEED_GPU();
  return run_ranks(2, stall_rank, "p2p");
}
TEST_IMPL(gpu_stall_alloc_shm) {
  NEED_GPU();
  return run_ranks(2, stall_rank, "shm");
}
TEST_IMPL(gpu_stall_alloc_socket) {
  NEED_GPU();
  return run_ranks(2, stall_rank, "net/socket");
}

#else

NO_CUDA(gpu_stall_alloc_p2p)
NO_CUDA(gpu_stall_alloc_shm)
NO_CUDA(gpu_stall_alloc_socket)

#endif
