/*
 * Loom: a collective communication library with the NCCL API.
 * SPDX-License-Identifier: Apache-2.0
 *
 * This header declares the NCCL 2.30 C API with NCCL's ABI values (the
 * config's layout, result codes, enums), so that a program written for
 * NCCL compiles against it unchanged and runs on Loom; programs built
 * against NVIDIA's 2.28 to 2.30 headers run on Loom's library too.
 *
 * The API level it reports (NCCL_VERSION_CODE) stays 2.27: from 2.28 on,
 * programs (nccl-tests among them) take that as the promise of NCCL's
 * device API, nccl_device.h, whose structures and inline functions are
 * compiled into the program's own kernels, and Loom has no device API.
 * Everything else 2.28 to 2.30 added is declared here all the same, and
 * ncclGetVersion reports the level the library implements (2.30.7).
 * docs/decisions.md says more. Loom's own extensions live in loom.h.
 */
#ifndef NCCL_H_
#define NCCL_H_

/* Programs built against NCCL expect nccl.h to bring in the CUDA runtime and
 * its half types. Where the toolkit is not on the include path (host-only
 * builds and programs), cudaStream_t is declared the way the runtime
 * declares it, so both headers can be included in any order. Built for AMD
 * GPUs (HIP), it brings in HIP's runtime instead, as RCCL's header does,
 * and the streams the API takes are HIP's. */
#if (defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)) && !defined(LOOM_NO_CUDA_HEADERS)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
typedef hipStream_t cudaStream_t;
#define NCCL_STREAM_IS_HIP 1
#elif defined(__has_include)
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
#if !defined(CUDART_VERSION) && !defined(NCCL_STREAM_IS_HIP)
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

#include <stdint.h>

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
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* The magic of the versioned structures below. */
#define NCCL_API_MAGIC 0xcafebeef

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

#define NCCL_REVOKE_DEFAULT 0x00

/* ncclCommSuspend: release the memory the communicator can rebuild. */
#define NCCL_SUSPEND_MEM 0x01

/* The first three fields let the library read configs of older and newer
 * layouts: it reads only the fields that `size` covers. */
typedef struct ncclConfig_v23000 {
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
  /* 2.28 to 2.30 */
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
} ncclConfig_t;

/* version: the layout's, 2.30 (the fields `size` covers are what the
 * library reads, whatever the API level above says). */
#define NCCL_CONFIG_INITIALIZER                                                               \
  {                                                                                           \
    sizeof(ncclConfig_t), NCCL_API_MAGIC, 23007,                                              \
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
        NCCL_CONFIG_UNDEF_INT, /* nChannelsPerNetPeer */                                      \
        NCCL_CONFIG_UNDEF_INT, /* nvlinkCentricSched */                                       \
        NCCL_CONFIG_UNDEF_INT, /* graphUsageMode */                                           \
        NCCL_CONFIG_UNDEF_INT, /* numRmaCtx */                                                \
        NCCL_CONFIG_UNDEF_INT, /* maxP2pPeers */                                              \
        NCCL_CONFIG_UNDEF_INT, /* graphStreamOrdering */                                      \
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
/* The buffer a window was registered with. */
LOOM_DECLARE(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void **outUserPtr);

/* Stops the communicator's work in flight and refuses new work, so that
 * the survivors of a failure can shrink or destroy it; revokeFlags must be
 * NCCL_REVOKE_DEFAULT. */
LOOM_DECLARE(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
/* Growing a communicator: one of its ranks makes an id (one at a time,
 * each used once), which the newcomers join with comm NULL and their rank
 * (the old size and above); existing ranks pass rank -1 and keep their
 * ranks (and pass the id only on the one that made it). The old
 * communicator stays; config NULL inherits its config. */
LOOM_DECLARE(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId *uniqueId);
LOOM_DECLARE(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
             ncclComm_t *newcomm, ncclConfig_t *config);
/* Releases the memory the communicator can rebuild (flags:
 * NCCL_SUSPEND_MEM), until ncclCommResume; no calls meanwhile. */
LOOM_DECLARE(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags);
LOOM_DECLARE(ncclResult_t, ncclCommResume, ncclComm_t comm);

typedef enum {
  ncclStatGpuMemSuspend = 0,   /* bytes that ncclCommSuspend releases */
  ncclStatGpuMemSuspended = 1, /* 1 while suspended */
  ncclStatGpuMemPersist = 2,   /* bytes held for the communicator's life */
  ncclStatGpuMemTotal = 3      /* both */
} ncclCommMemStat_t;
LOOM_DECLARE(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value);

typedef enum {
  NCCL_GIN_TYPE_NONE = 0,
  NCCL_GIN_TYPE_PROXY = 2,
  NCCL_GIN_TYPE_GDAKI = 3,
  NCCL_GIN_TYPE_GPI = 4
} ncclGinType_t;

/* What a communicator is and offers (ncclCommQueryProperties); the first
 * three fields as in ncclConfig_t. */
#ifdef __cplusplus
#define LOOM_BOOL_ bool
#else
#define LOOM_BOOL_ _Bool
#endif
typedef struct ncclCommProperties {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;
  LOOM_BOOL_ deviceApiSupport;
  LOOM_BOOL_ multimemSupport;
  ncclGinType_t ginType;
  int nLsaTeams;
  LOOM_BOOL_ hostRmaSupport;
  ncclGinType_t railedGinType;
} ncclCommProperties_t;
#undef LOOM_BOOL_
#define NCCL_COMM_PROPERTIES_INITIALIZER                                                      \
  { sizeof(ncclCommProperties_t), NCCL_API_MAGIC, 23007, 0, 0, -1, -1, 0, 0, NCCL_GIN_TYPE_NONE, 0, 0, \
    NCCL_GIN_TYPE_NONE }
LOOM_DECLARE(ncclResult_t, ncclCommQueryProperties, ncclComm_t comm, ncclCommProperties_t *props);

/* A peer's window as this process can load and store it: through shared
 * memory (host communicators) or CUDA IPC (CUDA ones) on the same host. */
LOOM_DECLARE(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t window, size_t offset, int peer, void **outPtr);
LOOM_DECLARE(ncclResult_t, ncclGetLsaDevicePointer, ncclWindow_t window, size_t offset, int lsaRank,
             void **outPtr);

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
/* Rank i's block j (count elements at sendbuff + j * count) goes to rank
 * j, at recvbuff + i * count. */
LOOM_DECLARE(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count,
             ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
/* Rank i's count elements land at recvbuff + i * count on root (in place
 * when sendbuff == recvbuff + root * count); recvbuff is unused elsewhere. */
LOOM_DECLARE(ncclResult_t, ncclGather, const void *sendbuff, void *recvbuff, size_t count,
             ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
/* Root's sendbuff + i * count goes to rank i's recvbuff (in place when
 * recvbuff == sendbuff + root * count); sendbuff is unused elsewhere. */
LOOM_DECLARE(ncclResult_t, ncclScatter, const void *sendbuff, void *recvbuff, size_t count,
             ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
LOOM_DECLARE(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype,
             int peer, ncclComm_t comm, cudaStream_t stream);
LOOM_DECLARE(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype,
             int peer, ncclComm_t comm, cudaStream_t stream);

/* One-sided: writes count elements into peer's window peerWin (the
 * handle this rank got when registering it) at peerWinOffset bytes, then
 * raises signal sigIdx of context ctx there; ncclSignal raises it alone,
 * and ncclWaitSignal waits until each descriptor's peer has raised its
 * signal opCnt more times. flags must be 0. */
LOOM_DECLARE(ncclResult_t, ncclPutSignal, const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
             ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
             cudaStream_t stream);
LOOM_DECLARE(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
             cudaStream_t stream);
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;
LOOM_DECLARE(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
             cudaStream_t stream);

/* Calls between ncclGroupStart and ncclGroupEnd run together: a group of
 * sends and receives to every peer is an all-to-all and cannot deadlock. */
LOOM_DECLARE(ncclResult_t, ncclGroupStart, void);
LOOM_DECLARE(ncclResult_t, ncclGroupEnd, void);
LOOM_DECLARE(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo);

/* The parameters (the environment variables Loom reads, docs/environment.md)
 * by key ("NCCL_SOCKET_IFNAME"): a handle, then the value as an integer
 * of the asked width (refused where it does not fit) or as text. The
 * strings and tables returned stay valid until the same call's next use
 * on the same thread. */
typedef struct ncclParamHandle *ncclParamHandle_t;
LOOM_DECLARE(ncclResult_t, ncclParamBind, ncclParamHandle_t *out, const char *key);
LOOM_DECLARE(ncclResult_t, ncclParamGetI8, ncclParamHandle_t h, int8_t *out);
LOOM_DECLARE(ncclResult_t, ncclParamGetI16, ncclParamHandle_t h, int16_t *out);
LOOM_DECLARE(ncclResult_t, ncclParamGetI32, ncclParamHandle_t h, int32_t *out);
LOOM_DECLARE(ncclResult_t, ncclParamGetI64, ncclParamHandle_t h, int64_t *out);
LOOM_DECLARE(ncclResult_t, ncclParamGetU8, ncclParamHandle_t h, uint8_t *out);
LOOM_DECLARE(ncclResult_t, ncclParamGetU16, ncclParamHandle_t h, uint16_t *out);
LOOM_DECLARE(ncclResult_t, ncclParamGetU32, ncclParamHandle_t h, uint32_t *out);
LOOM_DECLARE(ncclResult_t, ncclParamGetU64, ncclParamHandle_t h, uint64_t *out);
LOOM_DECLARE(ncclResult_t, ncclParamGetStr, ncclParamHandle_t h, const char **out);
LOOM_DECLARE(ncclResult_t, ncclParamGet, ncclParamHandle_t h, void *out, int maxLen, int *len);
LOOM_DECLARE(ncclResult_t, ncclParamGetParameter, const char *key, const char **value, int *valueLen);
LOOM_DECLARE(ncclResult_t, ncclParamGetAllParameterKeys, const char ***table, int *tableLen);
LOOM_DECLARE(void, ncclParamDumpAll, void);

#undef LOOM_DECLARE

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
