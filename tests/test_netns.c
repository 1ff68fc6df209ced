/*
 * Two hosts emulated on one machine (netns.h). Ranks 0-1 live in the
 * first, 2-3 in the second, so each pair talks over shared memory and the
 * ring crosses between them over sockets on the emulated hosts' interface,
 * which NCCL_SOCKET_IFNAME picks.
 */
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_matrix.h"
#include "harness.h"
#include "loom.h"
#include "netns.h"
#include "nccl.h"
#include "test.h"

static struct netns_hosts net;

/* Ranks 0-1 on the first host, the others on the second. */
static int enter_host(int rank, void *arg) { return netns_enter(&net, rank < 2 ? 0 : 1); }

static const char *expected(int from, int to) { return (from < 2) == (to < 2) ? "shm" : "net/socket"; }

static int matrix_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int calls = 0;
  if (coll_matrix(comm, rank, n, &calls))
    return 1;
  int next = (rank + 1) % n;
  const char *tr;
  RCHECK(comm, loomCommPeerTransport(comm, next, &tr));
  RASSERT(strcmp(tr, expected(rank, next)) == 0, "rank %d reaches rank %d over %s, expected %s", rank, next, tr,
          expected(rank, next));
  if (rank == 0)
    printf("2 hosts x 2 ranks: %d calls checked\n", calls);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(netns_two_hosts) {
  int rc = netns_hosts_up(&net, 2, 0);
  if (rc)
    return rc;
  setenv("NCCL_SOCKET_IFNAME", NETNS_IFNAME, 1);
  harness_set_rank_setup(enter_host);
  rc = run_ranks(4, matrix_rank, NULL);
  netns_hosts_down(&net);
  return rc;
}

/* Loopback does not cross hosts: with NCCL_SOCKET_IFNAME=lo the rank in
 * the second namespace cannot reach the root, and every rank says so
 * within the timeout instead of hanging: the far one names the root it
 * could not reach, the near ones the rank that never joined. */
static int unreachable_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  double t0 = now_s();
  ncclResult_t r = ncclCommInitRank(&comm, n, id, rank);
  const char *msg = ncclGetLastError(NULL);
  fprintf(stderr, "rank %d: %s\n", rank, msg);
  RASSERT(r == ncclRemoteError, "rank %d: expected ncclRemoteError, got %d (%s)", rank, (int)r, msg);
  if (rank == 2)
    RASSERT(strstr(msg, "bootstrap root at 127.0.0.1") != NULL, "the message should name the root: %s", msg);
  else
    RASSERT(strstr(msg, "rank(s) 2 of 3 did not join") != NULL, "the message should name rank 2: %s", msg);
  RASSERT(now_s() - t0 < 15, "took %.1f s", now_s() - t0);
  return 0;
}

TEST_IMPL(netns_wrong_ifname) {
  int rc = netns_hosts_up(&net, 2, 0);
  if (rc)
    return rc;
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("LOOM_TIMEOUT", "3", 1);
  harness_set_rank_setup(enter_host);
  rc = run_ranks(3, unreachable_rank, NULL);
  netns_hosts_down(&net);
  return rc;
}
