/*
 * Loom: a collective communication library with the NCCL API.
 * SPDX-License-Identifier: Apache-2.0
 *
 * RCCL's header, for programs built for AMD GPUs: ROCm builds of PyTorch
 * and others include <rccl/rccl.h> where CUDA builds include <nccl.h>
 * (hipify renames the include) and call the same nccl* functions, with
 * HIP's streams. This is Loom's nccl.h with HIP's runtime, plus the
 * names RCCL has and NCCL does not. Loom's HIP build installs it beside
 * nccl.h, and librccl.so.1 beside libnccl.so.2 (docs/building.md).
 */
#ifndef LOOM_RCCL_H_
#define LOOM_RCCL_H_

/* RCCL's header always brings in HIP's runtime: so does this one, even
 * where the compiler is not HIP's (a host compiler given the HIP headers). */
#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__) && !defined(__HIP_PLATFORM_NVCC__)
#define __HIP_PLATFORM_AMD__ 1
#endif
#include "../nccl.h"

/* What RCCL's header announces that it has, and Loom has too. Not
 * RCCL_FLOAT8: RCCL's ncclFp8E4M3 and ncclFp8E5M2 (datatypes 10 and 11)
 * are the FNUZ encodings on MI300, where Loom's reductions compute NCCL's
 * OCP ones (ncclFloat8e4m3, ncclFloat8e5m2), and there Loom refuses to
 * reduce them. */
#define RCCL_BFLOAT16 1
#define RCCL_GATHER_SCATTER 1
#define RCCL_ALLTOALLV 1

#ifdef __cplusplus
extern "C" {
#endif

/* RCCL's spelling of NCCL's ncclAlltoAll: rank i's block j (count
 * elements at sendbuff + j * count) goes to rank j, at recvbuff + i * count. */
ncclResult_t ncclAllToAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllToAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
/* Rank i sends sendcounts[j] elements from sendbuff + sdispls[j] to rank j,
 * and receives recvcounts[j] elements from rank j at recvbuff + rdispls[j]
 * (counts and displacements in elements of datatype, one entry per rank;
 * rank j's sendcounts[i] must equal rank i's recvcounts[j]). No in-place
 * form: the send and receive blocks must not overlap. */
ncclResult_t ncclAllToAllv(const void *sendbuff, const size_t sendcounts[], const size_t sdispls[], void *recvbuff,
                           const size_t recvcounts[], const size_t rdispls[], ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllToAllv(const void *sendbuff, const size_t sendcounts[], const size_t sdispls[], void *recvbuff,
                            const size_t recvcounts[], const size_t rdispls[], ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream);

/* RCCL's MSCCL entry points, for programs that link them: Loom has no
 * MSCCL, and each returns ncclInvalidUsage with a sentence. */
typedef int mscclAlgoHandle_t;
ncclResult_t mscclLoadAlgo(const char *mscclAlgoFilePath, mscclAlgoHandle_t *mscclAlgoHandle, int rank);
ncclResult_t mscclRunAlgo(const void *sendBuff, const size_t sendCounts[], const size_t sDisPls[], void *recvBuff,
                          const size_t recvCounts[], const size_t rDisPls[], size_t count, ncclDataType_t dataType,
                          int root, int peer, ncclRedOp_t op, mscclAlgoHandle_t mscclAlgoHandle, ncclComm_t comm,
                          cudaStream_t stream);
ncclResult_t mscclUnloadAlgo(mscclAlgoHandle_t mscclAlgoHandle);

#ifdef __cplusplus
}
#endif

#endif
