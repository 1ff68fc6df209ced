/*
 * The bootstrap and time: ranks that start late, rank 0 that starts last
 * behind NCCL_COMM_ID, a rank that never comes, sixteen ranks on a small
 * host; and NCCL_COMM_ID values that are no address.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

/* From test_bootstrap.c. */
int bt_names_rank(const char *s, int r);
int bt_allreduce_check(ncclComm_t comm, int rank, int nranks, char *why, size_t len);

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static int init_and_reduce(int rank, int nranks, ncclUniqueId id) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  char why[512];
  RASSERT(bt_allreduce_check(comm, rank, nranks, why, sizeof why) == 0, "rank %d: %s", rank, why);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* ---- a rank that starts late ---- */

static int late_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  /* The delay is the scenario: a rank whose process was slow to start. */
  if (rank == nranks - 1)
    sleep_s(1.5);
  return init_and_reduce(rank, nranks, id);
}

TEST_IMPL(bootstrap_late_rank) {
  setenv("LOOM_TIMEOUT", "20", 1);
  return run_ranks(3, late_rank, NULL);
}

/* ---- NCCL_COMM_ID, rank 0 last ---- */

static int order_pipe[2] = {-1, -1};

struct fixed_arg {
  char root[64];
};

static int fixed_rank(int rank, int nranks, ncclUniqueId piped, void *arg) {
  const struct fixed_arg *a = arg;
  /* With NCCL_COMM_ID no id needs passing: each rank makes its own, and
   * all must make the same one. */
  ncclUniqueId id;
  RCHECK(NULL, ncclGetUniqueId(&id));
  RASSERT(memcmp(&id, &piped, sizeof id) == 0, "rank %d computed another unique id than rank 0 from NCCL_COMM_ID",
          rank);
  char root[128];
  RCHECK(NULL, loomUniqueIdRootAddress(&id, root, sizeof root));
  RASSERT(strcmp(root, a->root) == 0, "rank %d: the id's root is %s, expected NCCL_COMM_ID's %s", rank, root, a->root);
  if (rank != 0) {
    char b = (char)rank;
    RASSERT(write(order_pipe[1], &b, 1) == 1, "rank %d: cannot tell rank 0 it starts", rank);
    return init_and_reduce(rank, nranks, id);
  }
  for (int seen = 0; seen < nranks - 1;) {
    struct pollfd p = {.fd = order_pipe[0], .events = POLLIN};
    RASSERT(poll(&p, 1, 15000) == 1, "rank 0: only %d of the other ranks started within 15 s", seen);
    char b;
    if (read(order_pipe[0], &b, 1) == 1)
      seen++;
  }
  /* The scenario: the others are now retrying a root that is not there. */
  sleep_s(0.7);
  return init_and_reduce(rank, nranks, id);
}

/* A loopback port the kernel chose; with `keep`, still bound and listening
 * (its fd in *keep), else closed so that the root can take it. */
static int loopback_port(int *keep) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  ASSERT(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &len) == 0);
  if (keep) {
    ASSERT(listen(s, 4) == 0);
    *keep = s;
  } else {
    close(s);
  }
  return ntohs(a.sin_port);
}

TEST_IMPL(bootstrap_comm_id_root_last) {
  struct fixed_arg arg;
  snprintf(arg.root, sizeof arg.root, "127.0.0.1:%d", loopback_port(NULL));
  setenv("NCCL_COMM_ID", arg.root, 1);
  setenv("LOOM_TIMEOUT", "20", 1);
  ASSERT(pipe(order_pipe) == 0);
  return run_ranks(3, fixed_rank, &arg);
}

/* Rank 0 cannot start the root where NCCL_COMM_ID says, because something
 * (a root of an earlier job that is still running) listens there. */
TEST_IMPL(bootstrap_comm_id_port_taken) {
  int held = -1;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", loopback_port(&held));
  setenv("NCCL_COMM_ID", addr, 1);
  setenv("LOOM_TIMEOUT", "5", 1);
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  double t0 = now_s();
  ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
  double took = now_s() - t0;
  const char *msg = ncclGetLastError(NULL);
  ASSERT_MSG(r == ncclSystemError || r == ncclInvalidUsage,
             "rank 0 with NCCL_COMM_ID=%s on a port in use: code %d (%s), expected ncclSystemError: %s", addr, (int)r,
             ncclGetErrorString(r), msg);
  ASSERT_MSG(strstr(msg, "NCCL_COMM_ID") && strstr(msg, addr) && strstr(msg, strerror(EADDRINUSE)),
             "the message should name NCCL_COMM_ID, %s and \"%s\": %s", addr, strerror(EADDRINUSE), msg);
  ASSERT_MSG(took < 2.0, "rank 0 took %.1f s to see that it cannot listen on %s", took, addr);
  close(held);
  return 0;
}

/* ---- a rank that never joins ---- */

static int absent_rank(int rank, int nranks, ncclUniqueId id, void *arg) {
  if (rank == 2)
    return 0;
  ncclComm_t comm = NULL;
  double t0 = now_s();
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  double took = now_s() - t0;
  const char *msg = ncclGetLastError(NULL);
  RASSERT(r != ncclSuccess, "rank %d made a communicator of 3 without rank 2", rank);
  RASSERT(r == ncclRemoteError || r == ncclSystemError,
          "rank %d: code %d (%s), expected ncclRemoteError or ncclSystemError: %s", rank, (int)r,
          ncclGetErrorString(r), msg);
  RASSERT(took >= 2.0 && took <= 8.0, "rank %d gave up after %.2f s with LOOM_TIMEOUT=3: %s", rank, took, msg);
  RASSERT(bt_names_rank(msg, 2), "rank %d: the message does not name rank 2 as the one missing: %s", rank, msg);
  RASSERT(strstr(msg, "LOOM_TIMEOUT") != NULL, "rank %d: the message does not mention LOOM_TIMEOUT: %s", rank, msg);
  return 0;
}

TEST_IMPL(bootstrap_rank_never_joins) {
  setenv("LOOM_TIMEOUT", "3", 1);
  return run_ranks(3, absent_rank, NULL);
}

/* ---- NCCL_COMM_ID values that are no address ---- */

TEST_IMPL(bootstrap_comm_id_invalid) {
  static const char *bad[] = {"nonsense", "127.0.0.1:99999", "noport:", "127.0.0.1:-1", "127.0.0.1:80x", "[::1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("NCCL_COMM_ID", bad[i], 1);
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    const char *msg = ncclGetLastError(NULL);
    ASSERT_MSG(r == ncclInvalidArgument, "NCCL_COMM_ID=%s: ncclGetUniqueId returned %d (%s), expected %d: %s", bad[i],
               (int)r, ncclGetErrorString(r), (int)ncclInvalidArgument, msg);
    ASSERT_MSG(strstr(msg, bad[i]) != NULL && strstr(msg, "NCCL_COMM_ID") != NULL,
               "NCCL_COMM_ID=%s: the message should quote the variable and its value: %s", bad[i], msg);
  }
  return 0;
}

/* ---- many ranks ---- */

static int many_rank(int rank, int nranks, ncclUniqueId id, void *arg) { return init_and_reduce(rank, nranks, id); }

TEST_IMPL(bootstrap_many_ranks) {
  setenv("LOOM_TIMEOUT", "60", 1);
  return run_ranks(16, many_rank, NULL);
}
