/* The parameter table: defaults, strict parsing, the error sentences. */
#include <stdio.h>
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

/* RCCL's own variables are named, not read: none set, one, several, and a
 * buffer too small for every name. */
TEST_IMPL(unit_param_rccl_unread) {
  extern char **environ;
  /* The test's own environment starts without any (unsetenv may move
   * environ, so each removal starts the scan again). */
  for (int again = 1; again;) {
    again = 0;
    for (char **e = environ; e && *e && !again; e++)
      if (strncmp(*e, "RCCL_", 5) == 0) {
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
        unsetenv(name);
        again = 1;
      }
  }
  char buf[64];
  ASSERT(param_rccl_unread(buf, sizeof buf) == 0 && buf[0] == '\0');
  setenv("RCCL_MSCCL_ENABLE", "1", 1);
  setenv("NCCL_MIN_NCHANNELS", "2", 1); /* NCCL's, read: not named */
  ASSERT(param_rccl_unread(buf, sizeof buf) == 1);
  ASSERT_MSG(strcmp(buf, "RCCL_MSCCL_ENABLE") == 0, "%s", buf);
  setenv("RCCL_ENABLE_CLIQUE", "1", 1);
  ASSERT(param_rccl_unread(buf, sizeof buf) == 2);
  ASSERT_MSG(strcmp(buf, "RCCL_MSCCL_ENABLE, RCCL_ENABLE_CLIQUE") == 0 ||
                 strcmp(buf, "RCCL_ENABLE_CLIQUE, RCCL_MSCCL_ENABLE") == 0,
             "%s", buf);
  setenv("RCCL_A_VERY_LONG_NAME_THAT_WILL_NOT_FIT_IN_THE_BUFFER", "x", 1);
  ASSERT(param_rccl_unread(buf, sizeof buf) == 3);
  ASSERT_MSG(strlen(buf) < sizeof buf && strstr(buf, "...") != NULL, "%s", buf);
  unsetenv("NCCL_MIN_NCHANNELS");
  return 0;
}
