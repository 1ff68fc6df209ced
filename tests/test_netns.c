/*
 * Two hosts emulated on one machine: two network namespaces joined by a
 * veth pair. Ranks 0-1 live in the first, 2-3 in the second, so each pair
 * talks over shared memory and the ring crosses between them over sockets
 * on the veth, which NCCL_SOCKET_IFNAME picks. Loom treats a network
 * namespace as a host of its own (topo_host_hash).
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
#include "nccl.h"
#include "test.h"

struct netns {
  char ns[2][32];
  char veth[2][16];
};

static int sh(const char *fmt, const char *a, const char *b) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  return system(cmd);
}

static void netns_down(struct netns *n) {
  for (int i = 0; i < 2; i++)
    sh("ip netns del %s 2>/dev/null%s", n->ns[i], "");
}

/* Returns 0, or TEST_SKIP with the reason printed. */
static int netns_up(struct netns *n) {
  if (geteuid() != 0) {
    fprintf(stderr, "SKIP: network namespaces need root\n");
    return TEST_SKIP;
  }
  if (system("ip -V >/dev/null 2>&1") != 0) {
    fprintf(stderr, "SKIP: the ip command (iproute2) is not installed\n");
    return TEST_SKIP;
  }
  int pid = (int)getpid();
  for (int i = 0; i < 2; i++) {
    snprintf(n->ns[i], sizeof n->ns[i], "loomhost%c%d", 'a' + i, pid);
    snprintf(n->veth[i], sizeof n->veth[i], "lm%d%c", pid % 10000000, 'a' + i);
  }
  if (sh("ip netns add %s 2>/dev/null && ip netns add %s 2>/dev/null", n->ns[0], n->ns[1]) != 0) {
    netns_down(n);
    fprintf(stderr, "SKIP: cannot create network namespaces here (ip netns add failed)\n");
    return TEST_SKIP;
  }
  int bad = sh("ip link add %s type veth peer name %s", n->veth[0], n->veth[1]);
  for (int i = 0; i < 2 && !bad; i++) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "ip link set %s netns %s && ip -n %s addr add 10.77.0.%d/24 dev %s && ip -n %s link set %s up && "
             "ip -n %s link set lo up",
             n->veth[i], n->ns[i], n->ns[i], i + 1, n->veth[i], n->ns[i], n->veth[i], n->ns[i]);
    bad = system(cmd);
  }
  if (bad) {
    netns_down(n);
    fprintf(stderr, "SKIP: cannot create a veth pair between the namespaces\n");
    return TEST_SKIP;
  }
  return 0;
}

static struct netns net;

static int enter_host(int rank, void *arg) {
  char path[64];
  snprintf(path, sizeof path, "/var/run/netns/%s", net.ns[rank < 2 ? 0 : 1]);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    perror(path);
    return 1;
  }
  close(fd);
  return 0;
}

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
  int rc = netns_up(&net);
  if (rc)
    return rc;
  /* Both ends of the veth start with "lm"; nothing else does. */
  setenv("NCCL_SOCKET_IFNAME", "lm", 1);
  harness_set_rank_setup(enter_host);
  rc = run_ranks(4, matrix_rank, NULL);
  netns_down(&net);
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
  int rc = netns_up(&net);
  if (rc)
    return rc;
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("LOOM_TIMEOUT", "3", 1);
  harness_set_rank_setup(enter_host);
  rc = run_ranks(3, unreachable_rank, NULL);
  netns_down(&net);
  return rc;
}
