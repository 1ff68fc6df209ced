/*
 * The IB plugin end to end, ranks as processes, over the verbs test double
 * (tests/verbs_double/) loaded through the plugin's own dlopen path: every
 * collective, several devices and QPs, NCCL_IB_HCA, and a completion error
 * injected mid-transfer. Real hardware is the final test of the plugin;
 * these prove its logic.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_matrix.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "netns.h"
#include "test.h"

#ifdef LOOM_VERBS_DOUBLE_PATH
static void use_double(void) {
  setenv("LOOM_IB_VERBS_LIB", LOOM_VERBS_DOUBLE_PATH, 1);
  setenv("NCCL_NET", "IB", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
}

static int matrix_rank(int rank, int n, ncclUniqueId id, void *arg) {
  int calls = 0;
  if (coll_matrix_rank(rank, n, id, "net/ib", &calls))
    return 1;
  if (rank == 0)
    printf("%d ranks over IB: %d calls checked\n", n, calls);
  return 0;
}

#define NEED_DOUBLE() use_double()
#else
#define NEED_DOUBLE() SKIP("the verbs test double was not built (no infiniband/verbs.h)")
static int matrix_rank(int rank, int n, ncclUniqueId id, void *arg) { return 1; }
#endif

TEST_IMPL(coll_ib_2) {
  NEED_DOUBLE();
  return run_ranks(2, matrix_rank, NULL);
}

/* Two channels over the double's two devices (a RoCE one and an
 * InfiniBand one), two QPs per connection, so messages are split. */
TEST_IMPL(coll_ib_4) {
  NEED_DOUBLE();
  setenv("NCCL_MIN_NCHANNELS", "2", 1);
  setenv("NCCL_IB_QPS_PER_CONNECTION", "2", 1);
  return run_ranks(4, matrix_rank, NULL);
}

/* Header and payload of each slot as two messages, as GPUDirect RDMA
 * connections carry them, over two QPs. */
TEST_IMPL(coll_ib_split_2) {
  NEED_DOUBLE();
  setenv("LOOM_NET_SPLIT_SLOTS", "1", 1);
  setenv("NCCL_IB_QPS_PER_CONNECTION", "2", 1);
  return run_ranks(2, matrix_rank, NULL);
}

/* Only the InfiniBand device: LIDs instead of GIDs address the QPs. */
TEST_IMPL(coll_ib_hca_3) {
  NEED_DOUBLE();
  setenv("NCCL_IB_HCA", "^=mlx5_0", 1);
  setenv("LOOM_TEST_ALLREDUCE_ONLY", "1", 1);
  return run_ranks(3, matrix_rank, NULL);
}

#ifdef LOOM_VERBS_DOUBLE_PATH
/* Rank 1's verbs fail its 40th send work request, in the middle of the
 * AllReduces' stream of RDMA writes; its QP goes to the error state, so
 * its peers' writes to it fail too. Every rank must return an error, none
 * may hang, and the ranks that see a verbs failure first (which ones
 * depends on what each was waiting for) must name the device, the peer
 * and the verbs status; the others name the rank that left. */
static int failing_rank(int rank, int n, ncclUniqueId id, void *arg) {
  if (rank == 1)
    setenv("LOOM_VERBS_DOUBLE_FAIL", "40", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  size_t count = 1 << 20;
  float *buf = calloc(count, sizeof *buf);
  RASSERT(buf, "out of memory");
  double t0 = now_s();
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < 20 && r == ncclSuccess; i++)
    r = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
  const char *msg = ncclGetLastError(comm);
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, ncclGetErrorString(r), now_s() - t0, msg);
  RASSERT(r == ncclRemoteError, "rank %d: expected ncclRemoteError, got %d", rank, (int)r);
  if (strstr(msg, "transport retry counter exceeded")) {
    const char *const kw[] = {"NET/IB mlx5_0:1", "transport retry counter exceeded", "over NET/IB", NULL};
    for (int k = 0; kw[k]; k++)
      RASSERT(strstr(msg, kw[k]) != NULL, "rank %d's message lacks \"%s\": %s", rank, kw[k], msg);
    int named = 0;
    for (int q = 0; q < n; q++) {
      char peer[32];
      snprintf(peer, sizeof peer, "rank %d (", q);
      named |= q != rank && strstr(msg, peer) != NULL;
    }
    RASSERT(named, "rank %d's message names no peer rank: %s", rank, msg);
    rank_signal('V');
  } else {
    /* A rank that did not see the verbs failure itself must hear of it
     * from the one that did, well before LOOM_TIMEOUT. */
    RASSERT(strstr(msg, "has exited") != NULL || strstr(msg, "closed by the peer") != NULL,
            "rank %d: neither a verbs error nor a peer gone: %s", rank, msg);
  }
  RASSERT(now_s() - t0 < 10, "rank %d took %.1f s to fail (LOOM_TIMEOUT is 15 s)", rank, now_s() - t0);
  free(buf);
  ncclCommAbort(comm);
  return 0;
}

static int completion_error_run(void) {
  pid_t pids[3];
  int events = -1;
  if (start_ranks(3, failing_rank, NULL, pids, &events) != 0)
    return 1;
  int rc = wait_ranks(3, pids);
  int verbs = 0; /* ranks that named the verbs failure */
  char c;
  while (read(events, &c, 1) == 1)
    verbs += c == 'V';
  close(events);
  if (rc == 0 && verbs == 0) {
    fprintf(stderr, "no rank reported the verbs failure itself\n");
    rc = 1;
  }
  return rc;
}
#else
static int completion_error_run(void) { return 1; }
#endif

TEST_IMPL(ib_completion_error) {
  NEED_DOUBLE();
  setenv("LOOM_TIMEOUT", "15", 1);
  return completion_error_run();
}

#ifdef LOOM_VERBS_DOUBLE_PATH
/* Two emulated hosts (netns.h) of two ranks: shared memory inside a host,
 * IB only between them, with each RoCE port's GID chosen as the IPv4
 * address of the interface the sockets use there, and logged. */
static struct netns_hosts hosts;
static char log_pattern[96];

static int enter_host(int rank, void *arg) { return netns_enter(&hosts, rank / 2); }

static int hosts_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int calls = 0;
  if (coll_matrix(comm, rank, n, &calls))
    return 1;
  for (int peer = 0; peer < n; peer++) {
    const char *tr = NULL;
    if (peer == rank || loomCommPeerTransport(comm, peer, &tr) != ncclSuccess || !tr)
      continue;
    const char *want = peer / 2 == rank / 2 ? "shm" : "net/ib";
    RASSERT(strcmp(tr, want) == 0, "rank %d reaches rank %d over %s, expected %s", rank, peer, tr, want);
  }
  RCHECK(comm, ncclCommDestroy(comm));
  char path[128], line[1024], want[160];
  snprintf(path, sizeof path, log_pattern, (int)getpid());
  snprintf(want, sizeof want, "uses GID index 3 (::ffff:%s), the address of interface %s", hosts.addr[rank / 2],
           NETNS_IFNAME);
  FILE *f = fopen(path, "r");
  RASSERT(f, "rank %d: no log at %s", rank, path);
  int found = 0;
  while (fgets(line, sizeof line, f))
    found += strstr(line, want) != NULL;
  fclose(f);
  unlink(path);
  RASSERT(found >= 1, "rank %d: the log never says \"%s\"", rank, want);
  if (rank == 0)
    printf("2 hosts x 2 ranks over shm and IB: %d calls checked\n", calls);
  return 0;
}

static int hosts_run(void) {
  int rc = netns_hosts_up(&hosts, 2, 0);
  if (rc)
    return rc;
  setenv("LOOM_IB_VERBS_LIB", LOOM_VERBS_DOUBLE_PATH, 1);
  setenv("NCCL_NET", "IB", 1);
  setenv("NCCL_SOCKET_IFNAME", NETNS_IFNAME, 1);
  setenv("LOOM_VERBS_DOUBLE_DEVICES", "mlx5_0:e", 1);
  setenv("LOOM_TEST_ALLREDUCE_ONLY", "1", 1);
  harness_net_log("ib-hosts", log_pattern, sizeof log_pattern);
  harness_set_rank_setup(enter_host);
  rc = run_ranks(4, hosts_rank, NULL);
  netns_hosts_down(&hosts);
  return rc;
}
#else
static int hosts_run(void) { return 1; }
#endif

TEST_IMPL(coll_ib_two_hosts) {
  NEED_DOUBLE();
  unsetenv("NCCL_SHM_DISABLE");
  return hosts_run();
}

#ifdef LOOM_VERBS_DOUBLE_PATH
/* config.netName names the plugin by what NCCL_NET takes ("IB" in any
 * case); a plugin other than the one the process uses is refused with a
 * sentence saying which it uses. */
static int netname_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm = NULL;
  ncclConfig_t other = NCCL_CONFIG_INITIALIZER;
  other.netName = "Socket";
  ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &other);
  const char *msg = ncclGetLastError(NULL);
  if (r != ncclInvalidUsage || !strstr(msg, "uses NET/IB") || comm != NULL) {
    fprintf(stderr, "rank %d: config.netName=Socket beside NCCL_NET=IB returned %d: %s\n", rank, (int)r, msg);
    return 1;
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.netName = "ib";
  if (ncclCommInitRankConfig(&comm, n, id, rank, &cfg) != ncclSuccess) {
    fprintf(stderr, "rank %d: config.netName=ib: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  float x[64];
  for (int i = 0; i < 64; i++)
    x[i] = (float)(rank + i);
  const char *name = NULL;
  int bad = ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comm, NULL) != ncclSuccess ||
            loomCommPeerTransport(comm, 1 - rank, &name) != ncclSuccess || strcmp(name, "net/ib") != 0;
  for (int i = 0; i < 64 && !bad; i++)
    bad = x[i] != (float)(1 + 2 * i);
  if (bad)
    fprintf(stderr, "rank %d: AllReduce over config.netName=ib: %s (transport %s)\n", rank, ncclGetLastError(comm),
            name ? name : "?");
  ncclCommDestroy(comm);
  return bad;
}
#endif

TEST_IMPL(config_netname_ib) {
  NEED_DOUBLE();
#ifdef LOOM_VERBS_DOUBLE_PATH
  return run_ranks(2, netname_rank, NULL);
#endif
}
