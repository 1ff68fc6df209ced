/* nccl.h carries NCCL's ABI: the values and layouts a program built
 * against NVIDIA's header relies on. */
#include <stddef.h>

#include "nccl.h"
#include "test.h"

_Static_assert(NCCL_UNIQUE_ID_BYTES == 128 && sizeof(ncclUniqueId) == 128, "unique id");
_Static_assert(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 && ncclInternalError == 3 &&
                   ncclInvalidArgument == 4 && ncclInvalidUsage == 5 && ncclRemoteError == 6 && ncclInProgress == 7 &&
                   ncclNumResults == 8,
               "result codes");
_Static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 && ncclNumOps == 5 &&
                   ncclMaxRedOp == 0x7fffffff && sizeof(ncclRedOp_t) == 4,
               "ops");
_Static_assert(ncclInt8 == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclUint32 == 3 && ncclInt64 == 4 &&
                   ncclUint64 == 5 && ncclFloat16 == 6 && ncclFloat32 == 7 && ncclFloat64 == 8 && ncclBfloat16 == 9 &&
                   ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11 && ncclNumTypes == 12,
               "datatypes");
_Static_assert(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1, "scalar residence");
_Static_assert(NCCL_VERSION_CODE == 22700 && NCCL_VERSION(2, 27, 0) == 22700 && NCCL_VERSION(2, 8, 4) == 2804 &&
                   NCCL_VERSION(2, 9, 6) == 20906,
               "version encoding");
_Static_assert(NCCL_SPLIT_NOCOLOR == -1 && NCCL_CONFIG_UNDEF_INT == (-2147483647 - 1), "constants");
/* ncclConfig_v22700 */
_Static_assert(offsetof(ncclConfig_t, size) == 0 && offsetof(ncclConfig_t, magic) == 8 &&
                   offsetof(ncclConfig_t, version) == 12 && offsetof(ncclConfig_t, blocking) == 16 &&
                   offsetof(ncclConfig_t, netName) == 32 && offsetof(ncclConfig_t, splitShare) == 40 &&
                   offsetof(ncclConfig_t, commName) == 48 && offsetof(ncclConfig_t, collnetEnable) == 56 &&
                   offsetof(ncclConfig_t, nvlsCTAs) == 68 && sizeof(ncclConfig_t) == 72,
               "config layout");
_Static_assert(sizeof(ncclSimInfo_t) == 24, "sim info layout");

TEST_IMPL(unit_abi) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  ASSERT(c.size == sizeof(ncclConfig_t) && c.magic == 0xcafebeef && c.version == 22700);
  ASSERT(c.blocking == NCCL_CONFIG_UNDEF_INT && c.netName == NULL && c.nvlsCTAs == NCCL_CONFIG_UNDEF_INT);
  ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
  ASSERT(s.magic == 0x74685283 && s.estimatedTime == NCCL_UNDEF_FLOAT);
  return 0;
}
