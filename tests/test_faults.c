/*
 * Faults of the network between emulated hosts (network namespaces): a
 * link slower than LOOM_TIMEOUT per slot still finishes, a lossy one that
 * TCP survives is survived, a silent one fails within the bound naming the
 * peer, and a reset says what is known rather than blaming the peer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "netns.h"
#include "test.h"

static struct netns_hosts net;

static int enter_host(int rank, void *arg) { return netns_enter(&net, rank % net.n); }

/* Runs `cmd` in every host; 0, or the first failure's status. */
static int on_every_host(const char *cmd) {
  for (int h = 0; h < net.n; h++) {
    int rc = netns_exec(&net, h, cmd);
    if (rc != 0)
      return rc;
  }
  return 0;
}

static int hosts_up(int n, const char *shape, const char *what) {
  int rc = netns_hosts_up(&net, n, 0);
  if (rc)
    return rc;
  if (shape && on_every_host(shape) != 0) {
    netns_hosts_down(&net);
    fprintf(stderr, "SKIP: cannot %s here (`%s` failed)\n", what, shape);
    return TEST_SKIP;
  }
  setenv("NCCL_SOCKET_IFNAME", NETNS_IFNAME, 1);
  harness_set_rank_setup(enter_host);
  return 0;
}

/* The test impairs the link once the ranks are connected: in a rank, say
 * so and wait until it is done (a byte on `go`); 0, or -1 if the test
 * gave up first. */
static int await_impairment(int go[2]) {
  close(go[1]);
  rank_signal('c');
  char b;
  return read(go[0], &b, 1) == 1 ? 0 : -1;
}

/* Starts the ranks and, once each has connected (await_impairment), runs
 * `cmd` on host `host` (-1: every host) and releases them: the command's
 * exit status. */
static int start_and_impair(int nranks, rank_fn fn, void *arg, int go[2], const char *cmd, int host, pid_t *pids,
                            int *events) {
  ASSERT(start_ranks(nranks, fn, arg, pids, events) == 0);
  close(go[0]);
  char b;
  for (int r = 0; r < nranks; r++)
    ASSERT(read(*events, &b, 1) == 1 && b == 'c');
  int rc = host < 0 ? on_every_host(cmd) : netns_exec(&net, host, cmd);
  ASSERT(write(go[1], "go", nranks) == nranks);
  return rc;
}

/* Rank 0 sends `bytes` to rank 1, which checks every byte. The
 * connections are made first, with the link as it was; with `go` set the
 * ranks then wait for the test to impair it. */
struct xfer {
  size_t bytes;
  int go[2]; /* -1: no impairment */
  /* -1: rank 0 destroys its comm at once; else it first waits for rank
   * 1's byte (or end) on fin[0], so that the link is judged while both
   * ends live: a sender that closes with bytes still in its socket is
   * not what the test is about. */
  int fin[2];
};

static int send_rank(int rank, int n, ncclUniqueId id, void *arg) {
  struct xfer *x = arg;
  size_t bytes = x->bytes;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  unsigned char *buf = malloc(bytes);
  RASSERT(buf, "out of memory");
  RCHECK(comm, rank == 0 ? ncclSend(buf, 1, ncclUint8, 1, comm, NULL) : ncclRecv(buf, 1, ncclUint8, 0, comm, NULL));
  if (x->go[0] >= 0)
    RASSERT(await_impairment(x->go) == 0, "rank %d: the test never impaired the link", rank);
  for (size_t i = 0; i < bytes; i++)
    buf[i] = rank == 0 ? (unsigned char)(i * 7 + (i >> 12)) : 0;
  double t0 = now_s();
  ncclResult_t r = rank == 0 ? ncclSend(buf, bytes, ncclUint8, 1, comm, NULL)
                             : ncclRecv(buf, bytes, ncclUint8, 0, comm, NULL);
  double took = now_s() - t0;
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: %s after %.1f s: %s\n", rank, ncclGetErrorString(r), took, ncclGetLastError(comm));
    free(buf);
    return 1;
  }
  printf("rank %d: %zu bytes in %.1f s (LOOM_TIMEOUT=%s)\n", rank, bytes, took, getenv("LOOM_TIMEOUT"));
  for (size_t i = 0; rank == 1 && i < bytes; i++)
    RASSERT(buf[i] == (unsigned char)(i * 7 + (i >> 12)), "rank 1: byte %zu is %u", i, buf[i]);
  free(buf);
  if (x->fin[0] >= 0) {
    close(x->fin[rank == 0 ? 1 : 0]);
    char b;
    if (rank == 0)
      RASSERT(read(x->fin[0], &b, 1) == 1, "rank 0: rank 1 ended without receiving everything");
    else
      RASSERT(write(x->fin[1], "f", 1) == 1, "rank 1: cannot tell rank 0 it is done");
  }
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* 300 kbit/s with no burst: one 256 KiB slot takes 7 s, over twice
 * LOOM_TIMEOUT, while bytes arrive all along. The shaper queues up to 20 s
 * of packets rather than drop them: with drops, TCP's backed-off
 * retransmissions can leave the link silent for seconds, which is what
 * LOOM_TIMEOUT is for (faults_lossy_link drops on purpose, on a pattern). */
TEST_IMPL(faults_slow_link) {
  int rc = hosts_up(2, "tc qdisc add dev " NETNS_IFNAME " root tbf rate 300kbit burst 3000 latency 20s",
                    "shape the link (tc ... tbf)");
  if (rc)
    return rc;
  setenv("LOOM_TIMEOUT", "3", 1);
  struct xfer x = {.bytes = 300 << 10, .go = {-1, -1}, .fin = {-1, -1}};
  rc = run_ranks(2, send_rank, &x);
  netns_hosts_down(&net);
  return rc;
}

/* One packet in 20 dropped at random, both ways, once the ranks are
 * connected: TCP's retransmissions keep bytes arriving, and so the
 * transfer finishes, intact, within LOOM_TIMEOUT. At random, though the
 * run then differs each time: a fixed pattern (every third packet) locks
 * into step with TCP's recovery, which then loses the same retransmission
 * round after round and goes silent for good, which LOOM_TIMEOUT is right
 * to call silence (2 runs in 8 with a shaper, every run on the bare
 * link). On the bare link an RTO is 200 ms; six losses in a row of one
 * retransmission or its ACK (0.1 each) leave 12.6 s of silence, hence
 * LOOM_TIMEOUT=10. Rank 0 keeps its comm until rank 1 has every byte. */
TEST_IMPL(faults_lossy_link) {
  int rc = hosts_up(2, NULL, NULL);
  if (rc)
    return rc;
  setenv("LOOM_TIMEOUT", "10", 1);
  struct xfer x = {.bytes = 16 << 20};
  ASSERT(pipe(x.go) == 0 && pipe(x.fin) == 0);
  pid_t pids[2];
  int events;
  const char *impair =
      "iptables -A INPUT -i " NETNS_IFNAME " -p tcp -m statistic --mode random --probability 0.05 -j DROP";
  int impaired = start_and_impair(2, send_rank, &x, x.go, impair, -1, pids, &events);
  close(x.go[1]);
  close(x.fin[0]);
  close(x.fin[1]);
  rc = wait_ranks(2, pids);
  netns_hosts_down(&net);
  if (impaired != 0)
    SKIP("cannot drop packets here (`%s` failed)", impair);
  return rc;
}

/* `go` releases the ranks once the link is cut (a byte each); `hold`
 * keeps a rank that failed alive until the test has heard from every
 * rank (it closes it), so a peer still lives while it is judged. */
struct cut {
  int go[2], hold[2];
  const char *const *want; /* words rank 0's message must have */
};

/* The connections are made by a first call; the test then cuts the link
 * (released through the pipe) and the second call must fail. */
static int cut_rank(int rank, int n, ncclUniqueId id, void *arg) {
  struct cut *k = arg;
  close(k->hold[1]);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { COUNT = 1 << 18 };
  float *buf = calloc(COUNT, sizeof *buf);
  RASSERT(buf, "out of memory");
  RCHECK(comm, ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));
  RASSERT(await_impairment(k->go) == 0, "rank %d: the test never cut the link", rank);
  double t0 = now_s();
  ncclResult_t r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
  double took = now_s() - t0;
  free(buf);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", ncclGetLastError(comm));
  printf("rank %d: %s after %.1f s: %s\n", rank, ncclGetErrorString(r), took, msg);
  fflush(stdout);
  rank_signal('f');
  /* Alive until every rank has failed: the message of one must not see
   * the other gone. */
  char b;
  RASSERT(read(k->hold[0], &b, 1) == 0, "rank %d: the pipe did not close", rank);
  ncclCommAbort(comm);
  RASSERT(r == ncclRemoteError || r == ncclSystemError, "rank %d: the AllReduce over a cut link returned %d", rank,
          (int)r);
  RASSERT(took < 15, "rank %d took %.1f s to fail", rank, took);
  for (const char *const *w = k->want; rank == 0 && *w; w++)
    RASSERT(strstr(msg, *w) != NULL, "rank %d's message lacks \"%s\": %s", rank, *w, msg);
  return 0;
}

static int cut_run(struct cut *k, int nranks, const char *cut_cmd, int host) {
  ASSERT(pipe(k->go) == 0 && pipe(k->hold) == 0);
  pid_t pids[2];
  int events;
  int cut = start_and_impair(nranks, cut_rank, k, k->go, cut_cmd, host, pids, &events);
  close(k->hold[0]);
  char b;
  for (int r = 0; cut == 0 && r < nranks; r++)
    ASSERT(read(events, &b, 1) == 1 && b == 'f');
  close(k->go[1]);
  close(k->hold[1]);
  int rc = wait_ranks(nranks, pids);
  if (cut != 0) {
    fprintf(stderr, "SKIP: cannot cut the link here (`%s` failed)\n", cut_cmd);
    return TEST_SKIP;
  }
  return rc;
}

/* A firewall starts resetting every TCP packet between two ranks of one
 * host (sockets, no shared memory): the connection was reset, said as
 * such, and the peer is known to be alive there. */
TEST_IMPL(faults_reset_same_host) {
  int rc = hosts_up(1, NULL, NULL);
  if (rc)
    return rc;
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("LOOM_TIMEOUT", "5", 1);
  static const char *const want[] = {"reset", "by the peer's host or by something between", "rank 1 (pid ",
                                     "is still running", NULL};
  struct cut k = {.want = want};
  /* The resets themselves cross the same loopback: they must pass. */
  rc = cut_run(&k, 2, "iptables -A INPUT -p tcp ! --tcp-flags RST RST -j REJECT --reject-with tcp-reset", 0);
  netns_hosts_down(&net);
  return rc;
}

/* The same across hosts: whether the peer lives is not known there. */
TEST_IMPL(faults_reset_two_hosts) {
  int rc = hosts_up(2, NULL, NULL);
  if (rc)
    return rc;
  setenv("LOOM_TIMEOUT", "5", 1);
  static const char *const want[] = {"reset", "by the peer's host or by something between", "rank 1 runs on",
                                     "cannot see", NULL};
  struct cut k = {.want = want};
  char cmd[160];
  snprintf(cmd, sizeof cmd, "iptables -A INPUT -p tcp -s %s -j REJECT --reject-with tcp-reset", net.addr[0]);
  rc = cut_run(&k, 2, cmd, 1);
  netns_hosts_down(&net);
  return rc;
}

/* A link that goes silent (every packet dropped) fails within
 * LOOM_TIMEOUT, naming the peer: slowness is not silence. */
TEST_IMPL(faults_silent_link) {
  int rc = hosts_up(2, NULL, NULL);
  if (rc)
    return rc;
  setenv("LOOM_TIMEOUT", "3", 1);
  static const char *const want[] = {"LOOM_TIMEOUT=3", "rank 1", NULL};
  struct cut k = {.want = want};
  rc = cut_run(&k, 2, "iptables -A INPUT -i " NETNS_IFNAME " -j DROP", 1);
  netns_hosts_down(&net);
  return rc;
}
