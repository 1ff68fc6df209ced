/*
 * A peer that dies (SIGKILL in the middle of a run of AllReduces) or stops
 * answering (SIGSTOP) never hangs the others: they return an error from
 * the collective that waits on it, naming a rank, within a bound. A killed
 * peer is noticed by its exit (pidfd on one host, the closed connection
 * across hosts), long before LOOM_TIMEOUT; a stopped one by LOOM_TIMEOUT.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

enum { VICTIM = 1, ITERS = 100000, COUNT = 1 << 20, PROPAGATED = 3 };

struct dead_cfg {
  int stop; /* SIGSTOP instead of SIGKILL */
  int separate_hosts;
  int small; /* 256 floats a call instead of COUNT */
  int pinned; /* 4 ranks pinned to 2 CPUs (flat by CPU): the victim leads its CPU */
};

static int loop_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct dead_cfg *cfg = arg;
  if (cfg->pinned && harness_pin(rank) != 0)
    return 1;
  if (cfg->separate_hosts) {
    /* Each rank its own host: sockets, and no pidfd to watch the others. */
    char host[32];
    snprintf(host, sizeof host, "fakehost%d", rank);
    setenv("NCCL_HOSTID", host, 1);
  }
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  /* Freed before any check below: a rank that passes is leak-checked, and
   * whether LeakSanitizer still finds a pointer on the stack is chance. */
  float *buf = calloc(COUNT, sizeof *buf);
  RASSERT(buf != NULL, "no memory for %d floats", COUNT);
  ncclResult_t r = ncclSuccess;
  int it;
  for (it = 0; it < ITERS && r == ncclSuccess; it++) {
    if (rank == VICTIM && it == 2)
      rank_signal('k'); /* the test kills or stops this process now */
    r = ncclAllReduce(buf, buf, cfg->small ? 256 : COUNT, ncclFloat, ncclSum, comm, NULL);
  }
  free(buf);
  if (r == ncclSuccess)
    return 1; /* the others never noticed */
  /* A copy: the message lives in the communicator, which the abort frees. */
  char msg[4096];
  snprintf(msg, sizeof msg, "%s", ncclGetLastError(comm));
  fprintf(stderr, "rank %d: iteration %d returned %s: %s\n", rank, it - 1, ncclGetErrorString(r), msg);
  ncclCommAbort(comm);
  RASSERT(r == ncclRemoteError || r == ncclSystemError, "unexpected result %d", (int)r);
  RASSERT(strstr(msg, "AllReduce") != NULL && strstr(msg, "rank ") != NULL,
          "the message should name the operation and a rank: %s", msg);
  /* A stopped peer is found by the timeout of some rank that waits (on
   * it, or on a rank that waits on it); the others hear of that rank's
   * failure. On one host the timeout names the stopped rank, following
   * who waits for whom through the status pages. */
  if (cfg->stop && !strstr(msg, "LOOM_TIMEOUT"))
    return PROPAGATED;
  if (cfg->stop && !cfg->separate_hosts)
    RASSERT(strstr(msg, "rank 1 (pid ") && strstr(msg, "is stopped"), "the timeout does not name rank 1: %s", msg);
  return 0;
}

static int dead_peer_run(struct dead_cfg *cfg, double bound_s) {
  enum { NMAX = 4 };
  int N = cfg->pinned ? 4 : 3;
  pid_t pids[NMAX];
  int events;
  ASSERT(start_ranks(N, loop_rank, cfg, pids, &events) == 0);
  char byte;
  ASSERT(read(events, &byte, 1) == 1 && byte == 'k');
  double t0 = now_s();
  kill(pids[VICTIM], cfg->stop ? SIGSTOP : SIGKILL);
  int failed = 0, named = 0;
  for (int r = 0; r < N; r++) {
    if (r == VICTIM)
      continue;
    int st;
    while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR)
      ;
    double took = now_s() - t0;
    printf("rank %d returned %.2f s after rank %d was %s\n", r, took, VICTIM, cfg->stop ? "stopped" : "killed");
    named += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!WIFEXITED(st) || (WEXITSTATUS(st) != 0 && !(cfg->stop && WEXITSTATUS(st) == PROPAGATED))) {
      fprintf(stderr, "rank %d did not end as expected (status 0x%x)\n", r, st);
      failed = 1;
    }
    if (took > bound_s) {
      fprintf(stderr, "rank %d took %.2f s, more than the bound of %.0f s\n", r, took, bound_s);
      failed = 1;
    }
  }
  if (cfg->stop && named == 0) {
    fprintf(stderr, "no rank reported the LOOM_TIMEOUT (rank %d was stopped)\n", VICTIM);
    failed = 1;
  }
  kill(pids[VICTIM], SIGKILL);
  waitpid(pids[VICTIM], NULL, 0);
  return failed;
}

/* The default LOOM_TIMEOUT (600 s) is far above the bound: detection
 * must come from the exit itself. */
TEST_IMPL(dead_peer_shm) {
  struct dead_cfg cfg = {0};
  return dead_peer_run(&cfg, 10);
}

TEST_IMPL(dead_peer_socket) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  struct dead_cfg cfg = {.separate_hosts = 1};
  return dead_peer_run(&cfg, 10);
}

TEST_IMPL(stuck_peer_timeout_shm) {
  setenv("LOOM_TIMEOUT", "2", 1);
  struct dead_cfg cfg = {.stop = 1};
  return dead_peer_run(&cfg, 10);
}

TEST_IMPL(stuck_peer_timeout_socket) {
  setenv("LOOM_TIMEOUT", "2", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  struct dead_cfg cfg = {.stop = 1, .separate_hosts = 1};
  return dead_peer_run(&cfg, 10);
}

/* The same at the arena's barriers (flat AllReduce): the others find the
 * killed rank by its exit, and the stopped one by the timeout, which
 * names it as the rank that never reached the barrier. */
TEST_IMPL(dead_peer_flat) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  struct dead_cfg cfg = {0};
  return dead_peer_run(&cfg, 10);
}

TEST_IMPL(stuck_peer_timeout_flat) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  setenv("LOOM_TIMEOUT", "2", 1);
  struct dead_cfg cfg = {.stop = 1};
  return dead_peer_run(&cfg, 10);
}

/* By CPU: rank 1 leads its CPU, so rank 3 waits for its sum or result,
 * and ranks 0 and 2 for it at the barrier. */
TEST_IMPL(dead_peer_flat_cpu) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  struct dead_cfg cfg = {.pinned = 1};
  return dead_peer_run(&cfg, 10);
}

TEST_IMPL(stuck_peer_timeout_flat_cpu) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  setenv("LOOM_TIMEOUT", "2", 1);
  struct dead_cfg cfg = {.stop = 1, .pinned = 1};
  return dead_peer_run(&cfg, 10);
}

/* Small calls post their data in slots instead of meeting at barriers. */
TEST_IMPL(dead_peer_flat_small) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  struct dead_cfg cfg = {.small = 1};
  return dead_peer_run(&cfg, 10);
}

TEST_IMPL(stuck_peer_timeout_flat_small) {
  setenv("NCCL_ALGO", "allreduce:flat", 1);
  setenv("LOOM_TIMEOUT", "2", 1);
  struct dead_cfg cfg = {.stop = 1, .small = 1};
  return dead_peer_run(&cfg, 10);
}

/* A rank that dies after init, before the first collective: the others
 * are still setting up connections over the bootstrap when they need it,
 * and even on another host (no pidfd) its closed bootstrap port says it
 * is gone. */
static int early_exit_rank(int rank, int n, ncclUniqueId id, void *arg) {
  char host[32];
  snprintf(host, sizeof host, "fakehost%d", rank);
  setenv("NCCL_HOSTID", host, 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  if (rank == VICTIM)
    _exit(0); /* gone without a word, like a crash */
  float buf[16] = {0};
  double t0 = now_s();
  ncclResult_t r = ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, NULL);
  const char *msg = ncclGetLastError(comm);
  fprintf(stderr, "rank %d: %s after %.2f s: %s\n", rank, ncclGetErrorString(r), now_s() - t0, msg);
  RASSERT(r == ncclRemoteError, "expected ncclRemoteError, got %d", (int)r);
  RASSERT(now_s() - t0 < 10, "took %.1f s to notice", now_s() - t0);
  ncclCommAbort(comm);
  return 0;
}

TEST_IMPL(dead_peer_before_first_collective) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  return run_ranks(3, early_exit_rank, NULL);
}

/* The sentence that names the first failure survives any number of calls
 * refused after it: each quotes it once, none quotes the one before. */
static int root_cause_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  float buf[16] = {0};
  RCHECK(comm, ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, NULL));
  if (rank == VICTIM)
    _exit(0);
  ncclResult_t first = ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, NULL);
  RASSERT(first != ncclSuccess, "rank %d: the AllReduce succeeded with rank %d gone", rank, VICTIM);
  char cause[4096];
  snprintf(cause, sizeof cause, "%s", ncclGetLastError(comm));
  for (int i = 0; i < 30; i++) {
    ncclResult_t r = i % 2 ? ncclBroadcast(buf, buf, 16, ncclFloat, 0, comm, NULL)
                           : ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, comm, NULL);
    const char *msg = ncclGetLastError(comm);
    RASSERT(r == first, "rank %d: call %d after the failure returned %d, not %d", rank, i, (int)r, (int)first);
    RASSERT(strstr(msg, cause) != NULL, "rank %d: after %d calls the first failure (%s) is lost: %s", rank, i + 1,
            cause, msg);
    const char *again = "failed earlier";
    const char *at = strstr(msg, again);
    RASSERT(at && !strstr(at + 1, again), "rank %d: call %d's message quotes an earlier refusal: %s", rank, i, msg);
  }
  printf("rank %d: after 30 refused calls: %s\n", rank, ncclGetLastError(comm));
  ncclCommAbort(comm);
  return 0;
}

TEST_IMPL(dead_peer_root_cause_kept) {
  setenv("LOOM_TIMEOUT", "20", 1);
  return run_ranks(3, root_cause_rank, NULL);
}

/* Across hosts over IB (the verbs test double): RC tells a receiver
 * nothing when its sender dies; the IB plugin's idle set-up connection,
 * which the kernel closes, does. */
TEST_IMPL(dead_peer_ib) {
#ifdef LOOM_VERBS_DOUBLE_PATH
  setenv("LOOM_IB_VERBS_LIB", LOOM_VERBS_DOUBLE_PATH, 1);
  setenv("NCCL_NET", "IB", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  struct dead_cfg cfg = {.separate_hosts = 1};
  return dead_peer_run(&cfg, 10);
#else
  SKIP("the verbs test double was not built (no infiniband/verbs.h)");
#endif
}
