/*
 * Both directions between two ranks on one connection (LOOM_NET_DUPLEX,
 * net.c's duplex_join): over sockets without data sockets, recursive
 * doubling's send and receive connection with the same peer, set up
 * together, share one wire, which the side that joins says once in its
 * log; rings and Send/Recv keep a connection each way.
 * Ranks that disagree (one sets LOOM_NET_DUPLEX=0) and connections with
 * data sockets connect each direction on its own. Every case runs
 * AllReduces of several sizes, in place and out of place, and a Send/Recv
 * exchange, and checks every element; a rank that dies mid-call fails
 * its peer's call, naming it.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

struct duplex_cfg {
  const char *rank1_duplex; /* LOOM_NET_DUPLEX on rank 1, NULL: unset */
  int shared;               /* whether the ranks must share their wires */
  int dies;                 /* rank 1 exits before the AllReduces of 1000 floats (recursive doubling) */
};

static float value(int rank, size_t i) { return (float)(rank * 1000 + (int)(i % 977)); }

static int allreduces(ncclComm_t comm, int rank, const struct duplex_cfg *cfg) {
  static const size_t counts[] = {2, 1000, 300007};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    size_t n = counts[k];
    float *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
    RASSERT(in && out, "out of memory");
    for (int inplace = 0; inplace <= 1; inplace++) {
      for (size_t i = 0; i < n; i++)
        in[i] = value(rank, i);
      float *dst = inplace ? in : out;
      if (cfg->dies && rank == 1 && k == 1)
        _exit(0); /* gone between calls, like a crash */
      ncclResult_t r = ncclAllReduce(in, dst, n, ncclFloat, ncclSum, comm, NULL);
      if (cfg->dies && k == 1) {
        const char *msg = ncclGetLastError(comm);
        RASSERT(r == ncclRemoteError || r == ncclSystemError, "rank 0 got %d after its peer died: %s", (int)r, msg);
        RASSERT(strstr(msg, "rank 1") != NULL, "the message should name rank 1: %s", msg);
        free(in);
        free(out);
        return 2;
      }
      RCHECK(comm, r);
      for (size_t i = 0; i < n; i++)
        RASSERT(dst[i] == value(0, i) + value(1, i), "rank %d: AllReduce of %zu floats %s: element %zu is %g, not %g",
                rank, n, inplace ? "in place" : "out of place", i, (double)dst[i],
                (double)(value(0, i) + value(1, i)));
    }
    free(in);
    free(out);
  }
  return 0;
}

static int exchange(ncclComm_t comm, int rank) {
  enum { N = 70001 };
  int peer = 1 - rank;
  int *out = malloc(N * sizeof *out), *in = malloc(N * sizeof *in);
  RASSERT(out && in, "out of memory");
  for (int i = 0; i < N; i++)
    out[i] = rank * 7919 + i;
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclSend(out, N, ncclInt32, peer, comm, NULL));
  RCHECK(comm, ncclRecv(in, N, ncclInt32, peer, comm, NULL));
  RCHECK(comm, ncclGroupEnd());
  for (int i = 0; i < N; i++)
    RASSERT(in[i] == peer * 7919 + i, "rank %d: element %d from rank %d is %d", rank, i, peer, in[i]);
  free(out);
  free(in);
  return 0;
}

static int duplex_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct duplex_cfg *cfg = arg;
  if (rank == 1 && cfg->rank1_duplex)
    setenv("LOOM_NET_DUPLEX", cfg->rank1_duplex, 1);
  /* Hosts of their own: the survivor cannot ask a peer's pidfd whether it
   * lives, so only the shared socket tells it that the peer is gone. */
  char host[32];
  snprintf(host, sizeof host, "duplexhost%d", rank);
  setenv("NCCL_HOSTID", host, 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  if (exchange(comm, rank))
    return 1;
  const char *tr;
  RCHECK(comm, loomCommPeerTransport(comm, 1 - rank, &tr));
  RASSERT(strcmp(tr, "net/socket") == 0, "rank %d reaches rank %d over %s", rank, 1 - rank, tr);
  int rc = allreduces(comm, rank, cfg);
  if (rc == 1)
    return 1;
  if (rc == 2) {
    RCHECK(NULL, ncclCommAbort(comm));
    harness_rank_log_remove("duplex");
    return 0;
  }
  RCHECK(comm, ncclCommDestroy(comm));
  /* Every connection logs once that it is up, and a shared pair's joining
   * side once more. Only recursive doubling's pairs share (the small
   * AllReduces here); the ring's and Send/Recv's never do. */
  int up = harness_rank_log_count("duplex", " via net");
  int rd = harness_rank_log_count("duplex", ": recursive doubling ");
  int shares = harness_rank_log_count("duplex", "shares the wire");
  harness_rank_log_remove("duplex");
  RASSERT(rd >= 2 && up > rd, "rank %d: the log says %d connection(s) came up, %d of recursive doubling", rank, up,
          rd);
  if (cfg->shared)
    RASSERT(2 * shares == rd, "rank %d: %d of its %d connections of recursive doubling joined another's wire, not half",
            rank, shares, rd);
  else
    RASSERT(shares == 0, "rank %d: %d of its %d connections joined another's wire", rank, shares, up);
  return 0;
}

static int duplex_run(const struct duplex_cfg *cfg, const char *nthreads) {
  setenv("NCCL_SHM_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_SOCKET_NTHREADS", nthreads, 1);
  setenv("NCCL_NSOCKS_PERTHREAD", "1", 1);
  unsetenv("LOOM_NET_DUPLEX");
  harness_rank_log("duplex", "INIT,NET");
  return run_ranks(2, duplex_rank, (void *)cfg);
}

TEST_IMPL(socket_duplex) {
  struct duplex_cfg cfg = {.shared = 1};
  return duplex_run(&cfg, "0");
}

/* One side says no: both connect each direction on their own. */
TEST_IMPL(socket_duplex_refused) {
  struct duplex_cfg cfg = {.rank1_duplex = "0", .shared = 0};
  return duplex_run(&cfg, "0");
}

/* Helper threads and data sockets: the plugin shares no such connection,
 * and the two fall back to one each way. */
TEST_IMPL(socket_duplex_threads) {
  struct duplex_cfg cfg = {.shared = 0};
  return duplex_run(&cfg, "1");
}

TEST_IMPL(socket_duplex_peer_dies) {
  struct duplex_cfg cfg = {.shared = 1, .dies = 1};
  return duplex_run(&cfg, "0");
}
