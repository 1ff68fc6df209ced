/*
 * Bad environment values are refused when a communicator is created, with
 * a sentence that quotes the variable and its value. Each test runs in a
 * process of its own, so setenv here affects only that test; the unique id
 * is made before the bad value is set, so that init itself is what must
 * notice.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

static int has_all(const char *msg, const char *const *kw) {
  for (; *kw; kw++)
    if (msg == NULL || strstr(msg, *kw) == NULL) {
      fprintf(stderr, "the last error does not mention \"%s\": %s\n", *kw, msg ? msg : "(null)");
      return 0;
    }
  return 1;
}

static int allreduce_ok(ncclComm_t comm) {
  float b[16];
  for (int i = 0; i < 16; i++)
    b[i] = (float)i;
  RCHECK(comm, ncclAllReduce(b, b, 16, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 16; i++)
    RASSERT(b[i] == (float)i, "1-rank AllReduce: element %d is %g", i, b[i]);
  return 0;
}

/* Sets name=value, expects a 1-rank init to fail with `want` and a message
 * with every keyword; then, where `retry`, checks that init works again
 * once the variable is gone. */
static int init_refuses(const char *name, const char *value, ncclResult_t want, int retry, const char *const *kw) {
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  setenv(name, value, 1);
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
  const char *msg = ncclGetLastError(NULL);
  ASSERT_MSG(r == want, "%s=%s: ncclCommInitRank returned %d (%s), expected %d (%s); last error: %s", name, value,
             (int)r, ncclGetErrorString(r), (int)want, ncclGetErrorString(want), msg);
  ASSERT_MSG(comm == NULL, "%s=%s: a failed init returned a communicator", name, value);
  ASSERT_MSG(has_all(msg, kw), "%s=%s", name, value);
  if (!retry)
    return 0;
  unsetenv(name);
  ASSERT_OK(ncclGetUniqueId(&id));
  ASSERT_OK(ncclCommInitRank(&comm, 1, id, 0));
  if (allreduce_ok(comm) != 0)
    return 1;
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

#define INIT_REFUSES(name, value, want, retry, ...) \
  init_refuses(name, value, want, retry, (const char *const[]){__VA_ARGS__, NULL})

TEST_IMPL(errors_env_buffsize_abc) {
  return INIT_REFUSES("NCCL_BUFFSIZE", "abc", ncclInvalidArgument, 1, "NCCL_BUFFSIZE=abc", "integer");
}

TEST_IMPL(errors_env_buffsize_range) {
  return INIT_REFUSES("NCCL_BUFFSIZE", "12", ncclInvalidArgument, 1, "NCCL_BUFFSIZE=12", "out of range", "4096");
}

TEST_IMPL(errors_env_shm_disable) {
  return INIT_REFUSES("NCCL_SHM_DISABLE", "2", ncclInvalidArgument, 1, "NCCL_SHM_DISABLE=2", "1");
}

TEST_IMPL(errors_env_timeout) {
  return INIT_REFUSES("LOOM_TIMEOUT", "-5", ncclInvalidArgument, 1, "LOOM_TIMEOUT=-5", "out of range");
}

TEST_IMPL(errors_env_debug) {
  return INIT_REFUSES("NCCL_DEBUG", "LOUD", ncclInvalidArgument, 1, "NCCL_DEBUG=LOUD", "INFO", "WARN");
}

/* The message must list what does exist, so the user can pick one. */
TEST_IMPL(errors_env_ifname) {
  return INIT_REFUSES("NCCL_SOCKET_IFNAME", "=nosuchif0", ncclInvalidArgument, 1, "NCCL_SOCKET_IFNAME==nosuchif0",
                      "lo (");
}

/* The network plugin is chosen once per process, so there is no retry. A
 * build without infiniband/verbs.h has no IB plugin to load, and says so. */
TEST_IMPL(errors_env_net_ib) {
  setenv("LOOM_IB_VERBS_LIB", "/nonexistent/libibverbs.so.1", 1);
#if LOOM_TEST_HAVE_IB
  return INIT_REFUSES("NCCL_NET", "IB", ncclSystemError, 0, "NCCL_NET=IB cannot be used",
                      "cannot load /nonexistent/libibverbs.so.1");
#else
  return INIT_REFUSES("NCCL_NET", "IB", ncclSystemError, 0, "NCCL_NET=IB cannot be used",
                      "this build of Loom has no IB plugin");
#endif
}

TEST_IMPL(errors_env_gdr_level) {
  setenv("NCCL_NET", "Socket", 1); /* so that init loads the network plugin */
  return INIT_REFUSES("NCCL_NET_GDR_LEVEL", "NEAR", ncclInvalidArgument, 0, "NCCL_NET_GDR_LEVEL=NEAR", "PHB");
}

/* A value NCCL would not take is refused at init, with the accepted ones. */
TEST_IMPL(errors_env_gdr_read) {
  if (INIT_REFUSES("NCCL_NET_GDR_READ", "2", ncclInvalidArgument, 1, "NCCL_NET_GDR_READ=2", "out of range", "-1",
                   "sends read device memory"))
    return 1;
  return INIT_REFUSES("NCCL_NET_GDR_READ", "yes", ncclInvalidArgument, 1, "NCCL_NET_GDR_READ=yes", "integer");
}

TEST_IMPL(errors_env_gdr_level_number) {
  setenv("NCCL_NET", "Socket", 1);
  return INIT_REFUSES("NCCL_NET_GDR_LEVEL", "-1", ncclInvalidArgument, 0, "NCCL_NET_GDR_LEVEL=-1", "legacy numbers");
}

TEST_IMPL(errors_env_net_bogus) {
  return INIT_REFUSES("NCCL_NET", "Bogus", ncclInvalidArgument, 0, "NCCL_NET=Bogus", "Socket");
}

/* ncclGetUniqueId is the first call of most programs: it must refuse too. */
TEST_IMPL(errors_env_unique_id) {
  setenv("NCCL_BUFFSIZE", "abc", 1);
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  ASSERT_MSG(r == ncclInvalidArgument, "ncclGetUniqueId returned %d: %s", (int)r, ncclGetLastError(NULL));
  ASSERT_MSG(strstr(ncclGetLastError(NULL), "NCCL_BUFFSIZE=abc") != NULL, "%s", ncclGetLastError(NULL));
  return 0;
}

/* Even where init does not look at the network plugin, the first use of
 * the network must say what is wrong (SHM off: ranks talk over it). */
static int net_first_use_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  if (r == ncclSuccess) {
    float b[16] = {0};
    r = ncclAllReduce(b, b, 16, ncclFloat, ncclSum, comm, NULL);
    const char *msg = ncclGetLastError(comm);
    RASSERT(r == ncclInvalidArgument, "AllReduce over NCCL_NET=Bogus returned %d: %s", (int)r, msg);
    RASSERT(strstr(msg, "NCCL_NET=Bogus") != NULL, "%s", msg);
    ncclCommAbort(comm);
    return 0;
  }
  RASSERT(r == ncclInvalidArgument, "init with NCCL_NET=Bogus returned %d: %s", (int)r, ncclGetLastError(NULL));
  RASSERT(strstr(ncclGetLastError(NULL), "NCCL_NET=Bogus") != NULL, "%s", ncclGetLastError(NULL));
  return 0;
}

TEST_IMPL(errors_env_net_first_use) {
  setenv("NCCL_NET", "Bogus", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  /* A rank that fails must not leave the other waiting for long. */
  setenv("LOOM_TIMEOUT", "10", 1);
  return run_ranks(2, net_first_use_rank, NULL);
}

/* Ranks that disagree on the FIFO size cannot talk: init says who uses
 * what, from each side. */
static int buffsize_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  setenv("NCCL_BUFFSIZE", rank == 0 ? "131072" : "65536", 1);
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  const char *msg = ncclGetLastError(NULL);
  RASSERT(r == ncclInvalidUsage, "rank %d: init returned %d (%s): %s", rank, (int)r, ncclGetErrorString(r), msg);
  RASSERT(comm == NULL, "rank %d: a failed init returned a communicator", rank);
  const char *const kw[] = {"NCCL_BUFFSIZE", "rank 0", "131072", "rank 1", "65536", NULL};
  RASSERT(has_all(msg, kw), "rank %d", rank);
  return 0;
}

TEST_IMPL(errors_env_buffsize_mismatch) {
  setenv("LOOM_TIMEOUT", "10", 1);
  return run_ranks(2, buffsize_rank, NULL);
}
