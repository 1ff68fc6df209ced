/* The parameter table: defaults, strict parsing, the error sentences. */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "test.h"

TEST_IMPL(unit_param) {
  unsetenv("NCCL_BUFFSIZE");
  ASSERT(param_int(P_BUFFSIZE) == 2097152);
  ASSERT(param_check_all() == ncclSuccess);
  setenv("NCCL_BUFFSIZE", "4m", 1);
  ASSERT(param_int(P_BUFFSIZE) == 4 << 20);
  setenv("NCCL_BUFFSIZE", "abc", 1);
  ASSERT(param_check_all() == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "NCCL_BUFFSIZE=abc is not an integer") != NULL);
  ASSERT(param_int(P_BUFFSIZE) == 2097152); /* a bad value never leaks through */
  setenv("NCCL_BUFFSIZE", "12", 1);
  ASSERT(param_check_all() == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "out of range") != NULL);
  unsetenv("NCCL_BUFFSIZE");
  setenv("NCCL_SHM_DISABLE", "yes", 1);
  ASSERT(param_check_all() == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "NCCL_SHM_DISABLE=yes is not 0 or 1") != NULL);
  unsetenv("NCCL_SHM_DISABLE");
  setenv("NCCL_DEBUG", "LOUD", 1);
  ASSERT(param_check_all() == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "NCCL_DEBUG=LOUD") != NULL);
  unsetenv("NCCL_DEBUG");
  setenv("NCCL_DEBUG_SUBSYS", "INIT,BOGUS", 1);
  ASSERT(param_check_all() == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "\"BOGUS\"") != NULL);
  setenv("NCCL_DEBUG_SUBSYS", "^INIT,NET", 1);
  ASSERT(param_check_all() == ncclSuccess);
  unsetenv("NCCL_DEBUG_SUBSYS");
  setenv("LOOM_TIMEOUT", "0", 1);
  ASSERT(param_check_all() == ncclInvalidArgument);
  setenv("LOOM_TIMEOUT", "5", 1);
  ASSERT(param_check_all() == ncclSuccess && param_int(P_TIMEOUT) == 5);
  unsetenv("LOOM_TIMEOUT");
  setenv("NCCL_SOCKET_FAMILY", "AF_UNIX", 1);
  ASSERT(param_check_all() == ncclInvalidArgument);
  unsetenv("NCCL_SOCKET_FAMILY");
  setenv("LOOM_DEVICE", "gpu", 1);
  ASSERT(param_check_all() == ncclInvalidArgument);
  unsetenv("LOOM_DEVICE");
  /* Every entry documents itself. */
  for (int i = 0; i < P_COUNT; i++)
    ASSERT(param_desc(i)->name && param_desc(i)->help && strlen(param_desc(i)->help) > 10);
  return 0;
}
