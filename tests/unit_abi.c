/* nccl.h carries NCCL's ABI: the values and layouts a program built
 * against NVIDIA's header relies on. The numbers are NVIDIA's 2.30.7
 * header's, measured by compiling a probe against it (offsetof, sizeof). */
#include <stddef.h>

#include "nccl.h"
#include "test.h"

_Static_assert(NCCL_UNIQUE_ID_BYTES == 128 && sizeof(ncclUniqueId) == 128, "unique id");
_Static_assert(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 && ncclInternalError == 3 &&
                   ncclInvalidArgument == 4 && ncclInvalidUsage == 5 && ncclRemoteError == 6 && ncclInProgress == 7 &&
                   ncclTimeout == 8 && ncclNumResults == 9,
               "result codes");
_Static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 && ncclNumOps == 5 &&
                   ncclMaxRedOp == 0x7fffffff && sizeof(ncclRedOp_t) == 4,
               "ops");
_Static_assert(ncclInt8 == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclUint32 == 3 && ncclInt64 == 4 &&
                   ncclUint64 == 5 && ncclFloat16 == 6 && ncclFloat32 == 7 && ncclFloat64 == 8 && ncclBfloat16 == 9 &&
                   ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11 && ncclNumTypes == 12,
               "datatypes");
_Static_assert(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1, "scalar residence");
/* The API level the header reports stays 2.27 (docs/decisions.md). */
_Static_assert(NCCL_VERSION_CODE == 22700 && NCCL_VERSION(2, 27, 0) == 22700 && NCCL_VERSION(2, 8, 4) == 2804 &&
                   NCCL_VERSION(2, 9, 6) == 20906 && NCCL_VERSION(2, 30, 7) == 23007,
               "version encoding");
_Static_assert(NCCL_SPLIT_NOCOLOR == -1 && NCCL_CONFIG_UNDEF_INT == (-2147483647 - 1) && NCCL_API_MAGIC == 0xcafebeef,
               "constants");
_Static_assert(NCCL_WIN_DEFAULT == 0 && NCCL_WIN_COLL_SYMMETRIC == 1 && NCCL_WIN_STRICT_ORDERING == 2 &&
                   NCCL_WIN_REQUIRED_ALIGNMENT == 4096 && NCCL_CTA_POLICY_ZERO == 2 && NCCL_REVOKE_DEFAULT == 0 &&
                   NCCL_SUSPEND_MEM == 1 && NCCL_SHRINK_ABORT == 1,
               "flags");
/* ncclConfig_v23000; a 2.27 header's ends after nvlsCTAs, at 72 bytes. */
_Static_assert(offsetof(ncclConfig_t, size) == 0 && offsetof(ncclConfig_t, magic) == 8 &&
                   offsetof(ncclConfig_t, version) == 12 && offsetof(ncclConfig_t, blocking) == 16 &&
                   offsetof(ncclConfig_t, netName) == 32 && offsetof(ncclConfig_t, splitShare) == 40 &&
                   offsetof(ncclConfig_t, commName) == 48 && offsetof(ncclConfig_t, collnetEnable) == 56 &&
                   offsetof(ncclConfig_t, nvlsCTAs) == 68 && offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72 &&
                   offsetof(ncclConfig_t, nvlinkCentricSched) == 76 && offsetof(ncclConfig_t, graphUsageMode) == 80 &&
                   offsetof(ncclConfig_t, numRmaCtx) == 84 && offsetof(ncclConfig_t, maxP2pPeers) == 88 &&
                   offsetof(ncclConfig_t, graphStreamOrdering) == 92 && sizeof(ncclConfig_t) == 96,
               "config layout");
_Static_assert(sizeof(ncclSimInfo_t) == 24, "sim info layout");
_Static_assert(sizeof(ncclWaitSignalDesc_t) == 16 && offsetof(ncclWaitSignalDesc_t, ctx) == 12, "wait descriptor");
_Static_assert(ncclStatGpuMemSuspend == 0 && ncclStatGpuMemSuspended == 1 && ncclStatGpuMemPersist == 2 &&
                   ncclStatGpuMemTotal == 3,
               "memory statistics");
_Static_assert(sizeof(ncclCommProperties_t) == 56 && offsetof(ncclCommProperties_t, rank) == 16 &&
                   offsetof(ncclCommProperties_t, cudaDev) == 24 && offsetof(ncclCommProperties_t, deviceApiSupport) == 32 &&
                   offsetof(ncclCommProperties_t, ginType) == 36 && offsetof(ncclCommProperties_t, nLsaTeams) == 40 &&
                   offsetof(ncclCommProperties_t, hostRmaSupport) == 44 &&
                   offsetof(ncclCommProperties_t, railedGinType) == 48,
               "communicator properties");

TEST_IMPL(unit_abi) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  ASSERT(c.size == sizeof(ncclConfig_t) && c.magic == 0xcafebeef && c.version == 23007);
  ASSERT(c.blocking == NCCL_CONFIG_UNDEF_INT && c.netName == NULL && c.nvlsCTAs == NCCL_CONFIG_UNDEF_INT &&
         c.graphStreamOrdering == NCCL_CONFIG_UNDEF_INT);
  ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
  ASSERT(s.magic == 0x74685283 && s.estimatedTime == NCCL_UNDEF_FLOAT);
  ncclCommProperties_t p = NCCL_COMM_PROPERTIES_INITIALIZER;
  ASSERT(p.size == sizeof p && p.magic == NCCL_API_MAGIC && p.version == 23007);
  return 0;
}
