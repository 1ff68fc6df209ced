/*
 * AlltoAll, Gather and Scatter (NCCL 2.28's): one group of sends and
 * receives per call. Every rank's every block is checked, out of place
 * and in place where NCCL defines it, with sizes from empty to several
 * FIFOs and odd counts; then what is refused: overlap, a bad root, counts
 * that differ between ranks (named as the collective's, not a bare Send).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

enum which { A2A, GATHER, SCATTER };

struct pc_cfg {
  enum which which;
  int socket;
};

/* The element i of the block that rank `from` sends to rank `to`. */
static int32_t value(int from, int to, size_t i) { return (int32_t)(from * 1000003 + to * 7919 + (int)(i % 65521)); }

static ncclResult_t run_one(enum which w, const void *s, void *r, size_t c, int root, ncclComm_t comm) {
  switch (w) {
  case A2A: return ncclAlltoAll(s, r, c, ncclInt32, comm, NULL);
  case GATHER: return ncclGather(s, r, c, ncclInt32, root, comm, NULL);
  default: return ncclScatter(s, r, c, ncclInt32, root, comm, NULL);
  }
}

/* One call at count c with root `root`, in place or not; checks every
 * element this rank should hold and the one past the end. */
static int check_call(ncclComm_t comm, int rank, int n, enum which w, size_t c, int root, int in_place) {
  size_t all = c * (size_t)n;
  int32_t *s = malloc(all * 4 + 4), *r = malloc(all * 4 + 4);
  void *ds = tbuf_alloc(comm, all * 4 + 4), *dr = tbuf_alloc(comm, all * 4 + 4);
  RASSERT(s && r && ds && dr, "out of memory");
  /* What this rank sends: block p for rank p (AlltoAll, root's Scatter),
   * or its one block for the root (Gather). */
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < c; i++)
      s[(size_t)p * c + i] = value(rank, w == GATHER ? root : p, i);
  RASSERT(tbuf_set(comm, dr, 0xee, all * 4 + 4) == 0, "clear");
  const void *send = ds;
  void *recv = dr;
  if (in_place && w == GATHER && rank == root) {
    /* The root's own block already sits at its place in recvbuff. */
    send = (char *)dr + (size_t)root * c * 4;
    RASSERT(tbuf_put(comm, (void *)send, s, c * 4) == 0, "copy in");
  } else if (in_place && w == SCATTER && rank == root) {
    RASSERT(tbuf_put(comm, dr, s, all * 4) == 0, "copy in");
    send = dr;
    recv = (char *)dr + (size_t)root * c * 4;
  } else {
    RASSERT(tbuf_put(comm, ds, s, (w == GATHER ? c : all) * 4) == 0, "copy in");
  }
  RCHECK(comm, tbuf_result(comm, run_one(w, send, recv, c, root, comm)));
  RASSERT(tbuf_get(comm, r, dr, all * 4 + 4) == 0, "copy out");
  size_t got = w == A2A ? all : w == GATHER ? (rank == root ? all : 0) : c;
  size_t at = w == SCATTER && in_place && rank == root ? (size_t)root * c : 0;
  for (size_t j = 0; j < got; j++) {
    int from = w == A2A || w == GATHER ? (int)(j / (c ? c : 1)) : root;
    int32_t want = value(from, rank, j % (c ? c : 1));
    RASSERT(r[at + j] == want, "%s count %zu root %d%s: element %zu on rank %d is %d, expected %d (from rank %d)",
            w == A2A ? "AlltoAll" : w == GATHER ? "Gather" : "Scatter", c, root, in_place ? " in place" : "", j, rank,
            r[at + j], want, from);
  }
  /* Nothing written past what the call owns; a Gather's non-root and the
   * whole of recvbuff beyond a Scatter's block stay as they were. */
  if (!(w == SCATTER && in_place && rank == root)) {
    const unsigned char *bytes = (const unsigned char *)(r + got);
    size_t rest = (all + 1 - got) * 4;
    for (size_t k = 0; k < rest; k++)
      RASSERT(bytes[k] == 0xee, "count %zu: byte %zu past the %zu elements received was written", c, k, got);
  }
  free(s);
  free(r);
  tbuf_free(ds);
  tbuf_free(dr);
  return 0;
}

static int matrix_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct pc_cfg *cfg = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  static const size_t counts[] = {0, 1, 7, 1031, 300007};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
    for (int root = 0; root < (cfg->which == A2A ? 1 : n); root++)
      for (int in_place = 0; in_place < (cfg->which == A2A ? 1 : 2); in_place++)
        if ((counts[k] < 100000 || root == n - 1) && check_call(comm, rank, n, cfg->which, counts[k], root, in_place))
          return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int run(int n, enum which w, int socket) {
  struct pc_cfg cfg = {.which = w, .socket = socket};
  if (socket) {
    setenv("NCCL_P2P_DISABLE", "1", 1);
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  return run_ranks(n, matrix_rank, &cfg);
}

TEST_IMPL(p2p_coll_alltoall_1) { return run(1, A2A, 0); }
TEST_IMPL(p2p_coll_alltoall_shm_3) { return run(3, A2A, 0); }
TEST_IMPL(p2p_coll_alltoall_socket_4) { return run(4, A2A, 1); }
TEST_IMPL(p2p_coll_gather_shm_3) { return run(3, GATHER, 0); }
TEST_IMPL(p2p_coll_gather_socket_2) { return run(2, GATHER, 1); }
TEST_IMPL(p2p_coll_scatter_shm_3) { return run(3, SCATTER, 0); }
TEST_IMPL(p2p_coll_scatter_socket_2) { return run(2, SCATTER, 1); }

/* ---- what is refused ---- */

static int refused(ncclComm_t comm, ncclResult_t r, const char *words) {
  RASSERT(r == ncclInvalidArgument, "result %d, expected ncclInvalidArgument", (int)r);
  const char *why = ncclGetLastError(comm);
  RASSERT(strstr(why, words) != NULL, "the sentence does not say \"%s\": %s", words, why);
  return 0;
}

static int refusals_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { C = 64 };
  char *b = tbuf_alloc(comm, (size_t)C * 4 * (size_t)n * 2);
  RASSERT(b, "out of memory");
  /* In place AlltoAll, and a half overlap of the two buffers. */
  if (refused(comm, ncclAlltoAll(b, b, C, ncclInt32, comm, NULL), "AlltoAll has no in-place form") ||
      refused(comm, ncclAlltoAll(b, b + C * 4, C, ncclInt32, comm, NULL), "overlap"))
    return 1;
  /* The root's Gather: recvbuff + root's block is in place, any other
   * overlap is not; a non-root's recvbuff is not used, so not checked. */
  if (rank == 0 && refused(comm, ncclGather(b + 4, b, C, ncclInt32, 0, comm, NULL), "in place is sendbuff =="))
    return 1;
  if (refused(comm, ncclScatter(b, b, C, ncclInt32, n, comm, NULL), "root") ||
      refused(comm, ncclGather(b, b + (size_t)C * 4 * (size_t)n, C, ncclInt32, -1, comm, NULL), "root") ||
      refused(comm, ncclAlltoAll(b, b + (size_t)C * 4 * (size_t)n, C, (ncclDataType_t)99, comm, NULL), "datatype") ||
      refused(comm, ncclAlltoAll(b, b + (size_t)C * 4 * (size_t)n, SIZE_MAX / 2, ncclInt32, comm, NULL),
              "overflows") ||
      refused(comm, ncclAlltoAll(NULL, b, C, ncclInt32, comm, NULL), "sendbuff is NULL"))
    return 1;
  /* Refusals moved nothing: the communicator still works. */
  RCHECK(comm, tbuf_result(comm, ncclAlltoAll(b, b + (size_t)C * 4 * (size_t)n, C, ncclInt32, comm, NULL)));
  tbuf_free(b);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(p2p_coll_refused) { return run_ranks(2, refusals_rank, NULL); }

/* Ranks whose AlltoAll counts differ: the sentence names the call. */
static int mismatch_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  setenv("LOOM_TIMEOUT", "20", 1);
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  size_t c = rank == 0 ? 100 : 101;
  void *s = tbuf_alloc(comm, 101 * 4 * (size_t)n), *r = tbuf_alloc(comm, 101 * 4 * (size_t)n);
  ncclResult_t res = tbuf_result(comm, ncclAlltoAll(s, r, c, ncclFloat, comm, NULL));
  RASSERT(res == ncclInvalidUsage || res == ncclRemoteError, "result %d", (int)res);
  const char *why = ncclGetLastError(comm);
  RASSERT(strstr(why, "AlltoAll") != NULL, "the sentence does not name the AlltoAll: %s", why);
  ncclCommAbort(comm);
  tbuf_free(s);
  tbuf_free(r);
  return 0;
}

TEST_IMPL(p2p_coll_mismatch) { return run_ranks(2, mismatch_rank, NULL); }
