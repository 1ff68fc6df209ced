/*
 * Loom: a collective communication library with the NCCL API.
 * SPDX-License-Identifier: Apache-2.0
 *
 * This header declares the NCCL 2.27 C API with NCCL's ABI values, so that a
 * program written for NCCL compiles against it unchanged and runs on Loom.
 * Loom's own extensions live in loom.h.
 */
#ifndef NCCL_H_
#define NCCL_H_

/* Programs built against NCCL expect nccl.h to bring in the CUDA runtime and
 * its half types. Where the toolkit is not on the include path (host-only
 * builds and programs), cudaStream_t is declared the way the runtime
 * declares it, so both headers can be included in any order. */
#if defined(__has_include)
#if __has_include(<cuda_runtime.h>) && !defined(LOOM_NO_CUDA_HEADERS)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#if defined(CUDART_VERSION) && CUDART_VERSION >= 11000
#include <cuda_bf16.h>
#endif
#if defined(CUDART_VERSION) && CUDART_VERSION >= 11080
#include <cuda_fp8.h>
#endif
#endif
#endif
#ifndef CUDART_VERSION
typedef struct CUstream_st *cudaStream_t;
#endif

#include <limits.h>
#include <stddef.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 27
#define NCCL_PATCH 0
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22700
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow *ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* The first three fields let the library read configs of older and newer
 * layouts: it reads only the fields that `size` covers. */
typedef struct ncclConfig_v22700 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                               \
  {                                                                                           \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),       \
        NCCL_CONFIG_UNDEF_INT, /* blocking */                                                 \
        NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */                                           \
        NCCL_CONFIG_UNDEF_INT, /* minCTAs */                                                  \
        NCCL_CONFIG_UNDEF_INT, /* maxCTAs */                                                  \
        NCCL_CONFIG_UNDEF_PTR, /* netName */                                                  \
        NCCL_CONFIG_UNDEF_INT, /* splitShare */                                               \
        NCCL_CONFIG_UNDEF_INT, /* trafficClass */                                             \
        NCCL_CONFIG_UNDEF_PTR, /* commName */                                                 \
        NCCL_CONFIG_UNDEF_INT, /* collnetEnable */                                            \
        NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */                                                \
        NCCL_CONFIG_UNDEF_INT, /* shrinkShare */                                              \
        NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */                                                 \
  }

typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                                             \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),      \
    NCCL_UNDEF_FLOAT }

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  /* The number of built-in operators, and the smallest value that
   * ncclRedOpCreate* hands out. */
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  /* The scalar is in device-visible memory, read while the collective runs. */
  ncclScalarDevice = 0,
  /* The scalar is in host memory, read before ncclRedOpCreate* returns. */
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Each function has a pnccl twin with the same signature, so that a
 * profiling library can define nccl* and forward to pnccl*. */
#define LOOM_DECLARE(ret, name, ...) \
  ret name(__VA_ARGS__);             \
  ret p##name(__VA_ARGS__)

LOOM_DECLARE(ncclResult_t, ncclMemAlloc, void **ptr, size_t size);
LOOM_DECLARE(ncclResult_t, ncclMemFree, void *ptr);
LOOM_DECLARE(ncclResult_t, ncclGetVersion, int *version);
LOOM_DECLARE(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId);
LOOM_DECLARE(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks,
             ncclUniqueId commId, int rank, ncclConfig_t *config);
LOOM_DECLARE(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId,
             int rank);
LOOM_DECLARE(ncclResult_t, ncclCommInitAll, ncclComm_t *comm, int ndev, const int *devlist);
LOOM_DECLARE(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
LOOM_DECLARE(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
LOOM_DECLARE(ncclResult_t, ncclCommAbort, ncclComm_t comm);
LOOM_DECLARE(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key,
             ncclComm_t *newcomm, ncclConfig_t *config);
LOOM_DECLARE(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList,
             int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
LOOM_DECLARE(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank,
             int nId, ncclUniqueId *commIds, ncclConfig_t *config);
LOOM_DECLARE(const char *, ncclGetErrorString, ncclResult_t result);
LOOM_DECLARE(const char *, ncclGetLastError, ncclComm_t comm);
LOOM_DECLARE(void, ncclResetDebugInit, void);
LOOM_DECLARE(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError);
LOOM_DECLARE(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count);
LOOM_DECLARE(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device);
LOOM_DECLARE(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank);
LOOM_DECLARE(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size,
             void **handle);
LOOM_DECLARE(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle);
LOOM_DECLARE(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size,
             ncclWindow_t *win, int winFlags);
LOOM_DECLARE(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);

/* A reduction operator that multiplies each rank's input by that rank's
 * scalar before summing. Valid only with `comm` and `datatype`. */
LOOM_DECLARE(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar,
             ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);
LOOM_DECLARE(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);

/* Collectives. On a CUDA communicator they are enqueued on `stream` and
 * return at once; on a host communicator `stream` must be NULL and they
 * return when the result is in recvbuff. */
LOOM_DECLARE(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count,
             ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
             cudaStream_t stream);
LOOM_DECLARE(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root,
             ncclComm_t comm, cudaStream_t stream);
LOOM_DECLARE(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count,
             ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
LOOM_DECLARE(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count,
             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
/* In place when recvbuff == sendbuff + rank * recvcount. */
LOOM_DECLARE(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff,
             size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
             cudaStream_t stream);
/* In place when sendbuff == recvbuff + rank * sendcount. */
LOOM_DECLARE(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
             ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
LOOM_DECLARE(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype,
             int peer, ncclComm_t comm, cudaStream_t stream);
LOOM_DECLARE(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype,
             int peer, ncclComm_t comm, cudaStream_t stream);

/* Calls between ncclGroupStart and ncclGroupEnd run together: a group of
 * sends and receives to every peer is an all-to-all and cannot deadlock. */
LOOM_DECLARE(ncclResult_t, ncclGroupStart, void);
LOOM_DECLARE(ncclResult_t, ncclGroupEnd, void);
LOOM_DECLARE(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo);

#undef LOOM_DECLARE

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
