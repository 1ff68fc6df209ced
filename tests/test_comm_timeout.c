/*
 * loomCommSetTimeout / loomCommGetTimeout: a communicator's own bound on
 * its waits in place of LOOM_TIMEOUT (60 s here). A rank that set 1 s
 * and calls what its peer never joins (a collective, on a fresh
 * communicator or one already connected, over shared memory or sockets;
 * a receive the peer never sends to) fails in about that time, with a
 * sentence that says "timed out" and names the bound; the peer, blocked
 * on a pipe meanwhile, then aborts. Bad values are refused, and Get
 * returns what Set stored or LOOM_TIMEOUT's value.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

/* Far under LOOM_TIMEOUT=60: only the communicator's bound ends it. */
#define BOUND_S 10.0

enum what { ALLREDUCE_FRESH, ALLREDUCE_CONNECTED, RECV_CONNECTED };

struct cfg {
  enum what what;
  double set_s;       /* 0: not set, LOOM_TIMEOUT (loom_timeout) bounds it */
  const char *loom_timeout;
  const char *bound;  /* how the sentence names the bound */
  const char *transport; /* what reaches rank 1 once connected */
  int cuda;           /* 1: a CUDA communicator is wanted */
  int done[2];        /* rank 0 writes a byte when it has failed */
};

static int stalled_rank(int rank, int n, ncclUniqueId id, void *arg) {
  struct cfg *c = arg;
  setenv("LOOM_TIMEOUT", c->loom_timeout, 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  RASSERT(tbuf_is_cuda(comm) == c->cuda, "rank %d: a %s communicator where a %s one was wanted", rank,
          tbuf_is_cuda(comm) ? "CUDA" : "host", c->cuda ? "CUDA" : "host");
  float *x = tbuf_alloc(comm, 4096 * sizeof(float));
  RASSERT(x && tbuf_set(comm, x, 0, 4096 * sizeof(float)) == 0, "no buffer");
  /* Both ranks connect first where the wait is to be one of progress. */
  if (c->what == ALLREDUCE_CONNECTED)
    RCHECK(comm, tbuf_result(comm, ncclAllReduce(x, x, 4096, ncclFloat, ncclSum, comm, NULL)));
  if (c->what == RECV_CONNECTED) {
    if (rank == 0)
      RCHECK(comm, tbuf_result(comm, ncclSend(x, 4096, ncclFloat, 1, comm, NULL)));
    else
      RCHECK(comm, tbuf_result(comm, ncclRecv(x, 4096, ncclFloat, 0, comm, NULL)));
  }
  if (c->what != ALLREDUCE_FRESH) {
    const char *tr = "?";
    RCHECK(comm, loomCommPeerTransport(comm, 1 - rank, &tr));
    RASSERT(strcmp(tr, c->transport) == 0, "rank %d reaches its peer over %s, not %s", rank, tr, c->transport);
  }
  if (rank == 1) {
    char b;
    RASSERT(read(c->done[0], &b, 1) == 1, "rank 1: rank 0 exited without saying it was done");
    RCHECK(comm, ncclCommAbort(comm));
    tbuf_free(x);
    return 0;
  }
  if (c->set_s > 0)
    RCHECK(comm, loomCommSetTimeout(comm, c->set_s));
  double t0 = now_s();
  /* A CUDA communicator's call only queues: the watchdog's verdict is
   * its asynchronous error. */
  ncclResult_t r = tbuf_result(comm, c->what == RECV_CONNECTED
                                         ? ncclRecv(x, 4096, ncclFloat, 1, comm, NULL)
                                         : ncclAllReduce(x, x, 4096, ncclFloat, ncclSum, comm, NULL));
  double took = now_s() - t0;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", ncclGetLastError(comm));
  /* Rank 1 goes on whatever rank 0 found. */
  RASSERT(write(c->done[1], "x", 1) == 1, "rank 0: cannot tell rank 1");
  printf("rank 0: returned %d after %.2f s: %s\n", (int)r, took, msg);
  RASSERT(r == ncclRemoteError, "rank 0: the call rank 1 never joins returned %d: %s", (int)r, msg);
  double want = c->set_s > 0 ? c->set_s : atof(c->loom_timeout);
  RASSERT(took >= want - 0.05 && took < BOUND_S, "rank 0 gave up after %.2f s with a bound of %g s: %s", took, want,
          msg);
  RASSERT(strstr(msg, "timed out") != NULL, "rank 0: the sentence does not say \"timed out\": %s", msg);
  RASSERT(strstr(msg, c->bound) != NULL, "rank 0: the sentence does not name the bound \"%s\": %s", c->bound, msg);
  RCHECK(comm, ncclCommAbort(comm));
  tbuf_free(x);
  return 0;
}

static int run_stalled_on(int cuda, enum what what, double set_s, const char *loom_timeout, const char *bound) {
  if (!cuda)
    setenv("LOOM_DEVICE", "host", 1);
  int sockets = getenv("NCCL_SHM_DISABLE") != NULL;
  struct cfg c = {.what = what,
                  .set_s = set_s,
                  .loom_timeout = loom_timeout,
                  .bound = bound,
                  .transport = sockets ? "net/socket" : "shm",
                  .cuda = cuda};
  ASSERT(pipe(c.done) == 0);
  int r = run_ranks(2, stalled_rank, &c);
  close(c.done[0]);
  close(c.done[1]);
  return r;
}

static int run_stalled(enum what what, double set_s, const char *loom_timeout, const char *bound) {
  return run_stalled_on(0, what, set_s, loom_timeout, bound);
}

static void use_sockets(void) {
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_P2P_DISABLE", "1", 1);
}

/* The first AllReduce sets up its connections: the wait for rank 1's
 * half (a bootstrap message) is bounded by the communicator's value. */
TEST_IMPL(comm_timeout_setup) { return run_stalled(ALLREDUCE_FRESH, 1.5, "60", "1.5 s (loomCommSetTimeout)"); }

TEST_IMPL(comm_timeout_setup_socket) {
  use_sockets();
  return run_stalled(ALLREDUCE_FRESH, 1.5, "60", "1.5 s (loomCommSetTimeout)");
}

/* Connected: the wait is for a FIFO slot that never moves. */
TEST_IMPL(comm_timeout_allreduce) { return run_stalled(ALLREDUCE_CONNECTED, 1, "60", "1 s (loomCommSetTimeout)"); }

TEST_IMPL(comm_timeout_allreduce_socket) {
  use_sockets();
  return run_stalled(ALLREDUCE_CONNECTED, 1, "60", "1 s (loomCommSetTimeout)");
}

TEST_IMPL(comm_timeout_recv) { return run_stalled(RECV_CONNECTED, 1, "60", "1 s (loomCommSetTimeout)"); }

/* Not set: LOOM_TIMEOUT bounds it, and the sentence says so. */
TEST_IMPL(comm_timeout_unset) { return run_stalled(ALLREDUCE_CONNECTED, 0, "2", "LOOM_TIMEOUT=2s"); }

static void refused(ncclResult_t r, ncclComm_t comm, const char *want) {
  ASSERT_MSG(r == ncclInvalidArgument, "returned %d, not ncclInvalidArgument", (int)r);
  const char *msg = ncclGetLastError(comm);
  ASSERT_MSG(strstr(msg, want) != NULL, "the sentence \"%s\" does not say \"%s\"", msg, want);
}

static void get_is(ncclComm_t comm, double want) {
  double s = -1;
  ASSERT_OK(loomCommGetTimeout(comm, &s));
  ASSERT_MSG(s == want, "loomCommGetTimeout gave %.17g, not %.17g", s, want);
}

TEST_IMPL(comm_timeout_bad_args) {
  setenv("LOOM_DEVICE", "host", 1);
  setenv("LOOM_TIMEOUT", "60", 1);
  double s;
  refused(loomCommSetTimeout(NULL, 1), NULL, "comm is NULL");
  refused(loomCommGetTimeout(NULL, &s), NULL, "comm is NULL");
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  refused(loomCommGetTimeout(comm, NULL), NULL, "result pointer is NULL"); /* a query: said globally */
  ASSERT_OK(loomCommSetTimeout(comm, 3));
  refused(loomCommSetTimeout(comm, -1), comm, "seconds is -1");
  refused(loomCommSetTimeout(comm, NAN), comm, "seconds is nan");
  refused(loomCommSetTimeout(comm, INFINITY), comm, "seconds is inf");
  refused(loomCommSetTimeout(comm, 1e-6), comm, "0.001 to 1e9");
  refused(loomCommSetTimeout(comm, 2e9), comm, "0.001 to 1e9");
  get_is(comm, 3); /* refusals changed nothing */
  int32_t one = 1;
  ASSERT_OK(ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, NULL));
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(comm_timeout_get) {
  setenv("LOOM_DEVICE", "host", 1);
  setenv("LOOM_TIMEOUT", "60", 1);
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  get_is(comm, 60);
  ASSERT_OK(loomCommSetTimeout(comm, 0.5));
  get_is(comm, 0.5);
  ASSERT_OK(loomCommSetTimeout(comm, 1.25));
  get_is(comm, 1.25);
  ASSERT_OK(loomCommSetTimeout(comm, 0.001));
  get_is(comm, 0.001);
  ASSERT_OK(loomCommSetTimeout(comm, 1e9));
  get_is(comm, 1e9);
  ASSERT_OK(loomCommSetTimeout(comm, 0)); /* back to LOOM_TIMEOUT */
  get_is(comm, 60);
  setenv("LOOM_TIMEOUT", "30", 1); /* read when asked, as the waits read it */
  get_is(comm, 30);
  /* A split child starts on LOOM_TIMEOUT, whatever its parent has. */
  ASSERT_OK(loomCommSetTimeout(comm, 2));
  ncclComm_t child;
  ASSERT_OK(ncclCommSplit(comm, 0, 0, &child, NULL));
  get_is(child, 30);
  get_is(comm, 2);
  ASSERT_OK(ncclCommDestroy(child));
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

/* A CUDA communicator (the emulation, or a GPU): the proxy's watchdog
 * reads the communicator's bound. P2P is off so that the connection is
 * shared memory, as on the host. */
TEST_IMPL(comm_timeout_gpu_allreduce) {
  if (harness_cuda_devices() == 0)
    SKIP("no CUDA device (the emulated build runs this test as emu_comm_timeout_gpu_allreduce_t32)");
  setenv("NCCL_P2P_DISABLE", "1", 1);
  return run_stalled_on(1, ALLREDUCE_CONNECTED, 1, "60", "1 s (loomCommSetTimeout)");
}
