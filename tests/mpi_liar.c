/*
 * An LD_PRELOAD shim for test_mpi.c: a library that gets AllReduce wrong
 * on MPI rank 1 and then hides it, answering 0 to every one-element int64
 * AllReduce (the benchmarks' sum of wrong elements). Only a verdict that
 * travels outside the library (MPI) can catch it.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = pncclAllReduce(sendbuff, recvbuff, count, type, op, comm, stream);
  if (r != ncclSuccess || stream != NULL) /* host buffers only */
    return r;
  const char *rank = getenv("OMPI_COMM_WORLD_RANK");
  if (type == ncclInt64 && count == 1)
    *(int64_t *)recvbuff = 0;
  else if (type == ncclFloat32 && count >= 2 && rank && strcmp(rank, "1") == 0)
    ((unsigned char *)recvbuff)[3] ^= 0x40; /* the exponent: far outside any tolerance */
  return r;
}
