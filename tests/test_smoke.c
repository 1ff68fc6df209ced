/* A first end-to-end check: two ranks, one AllReduce. */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

static int smoke_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  enum { N = 100003 };
  float *buf = malloc(N * sizeof *buf);
  for (int i = 0; i < N; i++)
    buf[i] = (float)(rank + 1) * (float)(i % 7);
  RCHECK(comm, ncclAllReduce(buf, buf, N, ncclFloat, ncclSum, comm, NULL));
  float scale = (float)(nranks * (nranks + 1) / 2);
  for (int i = 0; i < N; i++)
    RASSERT(buf[i] == scale * (float)(i % 7), "element %d is %g, expected %g", i, buf[i], scale * (float)(i % 7));
  free(buf);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(smoke_allreduce_2) { return run_ranks(2, smoke_rank, NULL); }
