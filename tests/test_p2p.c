/*
 * Point to point: rings of sends and receives, all-to-all groups (which
 * deadlock unless every send and receive of the group progresses at once),
 * sends to oneself, and messages larger than a connection's FIFO.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

static int32_t value(int from, int to, size_t i) { return (int32_t)(from * 1000003 + to * 7919 + (int)(i % 65521)); }

struct p2p_cfg {
  size_t count;
  int socket;
};

/* Each rank sends to the next and receives from the previous, in one
 * group, for a spread of sizes including ones that span many FIFO slots. */
static int ring_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct p2p_cfg *cfg = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  static const size_t counts[] = {0, 1, 7, 4097, 1 << 20};
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    size_t c = counts[k];
    int32_t *s = malloc(c * 4 + 4), *r = malloc(c * 4 + 4);
    void *ds = tbuf_alloc(comm, c * 4 + 4), *dr = tbuf_alloc(comm, c * 4 + 4);
    RASSERT(s && r && ds && dr, "out of memory");
    for (size_t i = 0; i < c; i++)
      s[i] = value(rank, next, i);
    RASSERT(tbuf_put(comm, ds, s, c * 4) == 0 && tbuf_set(comm, dr, 0, c * 4 + 4) == 0, "copy in");
    RCHECK(comm, ncclGroupStart());
    RCHECK(comm, ncclSend(ds, c, ncclInt32, next, comm, NULL));
    RCHECK(comm, ncclRecv(dr, c, ncclInt32, prev, comm, NULL));
    RCHECK(comm, ncclGroupEnd());
    RCHECK(comm, tbuf_result(comm, ncclSuccess));
    RASSERT(tbuf_get(comm, r, dr, c * 4 + 4) == 0, "copy out");
    for (size_t i = 0; i < c; i++)
      RASSERT(r[i] == value(prev, rank, i), "count %zu: element %zu from rank %d is %d, expected %d", c, i, prev,
              r[i], value(prev, rank, i));
    RASSERT(r[c] == 0, "count %zu: the element past the end was written (%d)", c, r[c]);
    free(s);
    free(r);
    tbuf_free(ds);
    tbuf_free(dr);
  }
  const char *tr;
  RCHECK(comm, loomCommPeerTransport(comm, next, &tr));
  /* Between CUDA communicators on one host, CUDA IPC where P2P is allowed. */
  const char *p2p = getenv("NCCL_P2P_DISABLE");
  int ipc_ok = !cfg->socket && tbuf_is_cuda(comm) && !(p2p && atoi(p2p) == 1);
  RASSERT(strcmp(tr, cfg->socket ? "net/socket" : "shm") == 0 || (ipc_ok && strcmp(tr, "p2p") == 0),
          "reached rank %d over %s", next, tr);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* Every rank sends a different block to every rank, itself included, in
 * one group. Blocks are larger than a FIFO, so the group only completes if
 * all its sends and receives move together. */
static int alltoall_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct p2p_cfg *cfg = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  size_t c = cfg->count;
  int32_t *s = malloc(c * 4 * n), *r = malloc(c * 4 * n);
  int32_t *ds = tbuf_alloc(comm, c * 4 * n), *dr = tbuf_alloc(comm, c * 4 * n);
  RASSERT(s && r && ds && dr, "out of memory");
  for (int round = 0; round < 2; round++) {
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < c; i++)
        s[(size_t)p * c + i] = value(rank, p, i + (size_t)round);
    RASSERT(tbuf_put(comm, ds, s, c * 4 * n) == 0 && tbuf_set(comm, dr, 0xff, c * 4 * n) == 0, "copy in");
    RCHECK(comm, ncclGroupStart());
    for (int p = 0; p < n; p++) {
      RCHECK(comm, ncclSend(ds + (size_t)p * c, c, ncclInt32, p, comm, NULL));
      RCHECK(comm, ncclRecv(dr + (size_t)p * c, c, ncclInt32, p, comm, NULL));
    }
    RCHECK(comm, ncclGroupEnd());
    RCHECK(comm, tbuf_result(comm, ncclSuccess));
    RASSERT(tbuf_get(comm, r, dr, c * 4 * n) == 0, "copy out");
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < c; i++)
        RASSERT(r[(size_t)p * c + i] == value(p, rank, i + (size_t)round), "round %d: block from rank %d element %zu",
                round, p, i);
  }
  free(s);
  free(r);
  tbuf_free(ds);
  tbuf_free(dr);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* Several messages between the same pair in one group arrive in order. */
static int ordered_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { M = 5, C = 70000 };
  int32_t *buf = malloc((size_t)M * C * 4), *dbuf = tbuf_alloc(comm, (size_t)M * C * 4);
  RASSERT(buf && dbuf, "out of memory");
  int peer = rank ^ 1;
  if (rank == 0)
    for (int m = 0; m < M; m++)
      for (size_t i = 0; i < C; i++)
        buf[(size_t)m * C + i] = value(m, 0, i);
  else
    memset(buf, 0, (size_t)M * C * 4);
  RASSERT(tbuf_put(comm, dbuf, buf, (size_t)M * C * 4) == 0, "copy in");
  RCHECK(comm, ncclGroupStart());
  for (int m = 0; m < M; m++) {
    int32_t *b = dbuf + (size_t)m * C;
    if (rank == 0)
      RCHECK(comm, ncclSend(b, C - m, ncclInt32, peer, comm, NULL));
    else
      RCHECK(comm, ncclRecv(b, C - m, ncclInt32, peer, comm, NULL));
  }
  RCHECK(comm, ncclGroupEnd());
  RCHECK(comm, tbuf_result(comm, ncclSuccess));
  RASSERT(tbuf_get(comm, buf, dbuf, (size_t)M * C * 4) == 0, "copy out");
  if (rank == 1)
    for (int m = 0; m < M; m++)
      for (size_t i = 0; i < (size_t)(C - m); i++)
        RASSERT(buf[(size_t)m * C + i] == value(m, 0, i), "message %d element %zu out of order", m, i);
  free(buf);
  tbuf_free(dbuf);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* Sends outside a group, as NCCL allows when the peer's matching call
 * comes later: small messages are buffered by the FIFO. */
static int blocking_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int32_t s[100], r[100];
  int32_t *ds = tbuf_alloc(comm, sizeof s), *dr = tbuf_alloc(comm, sizeof r);
  RASSERT(ds && dr, "out of memory");
  for (int i = 0; i < 100; i++)
    s[i] = value(rank, 1 - rank, (size_t)i);
  RASSERT(tbuf_put(comm, ds, s, sizeof s) == 0 && tbuf_set(comm, dr, 0, sizeof r) == 0, "copy in");
  /* A CUDA communicator's send is done once its kernel ran: it is queued
   * before the receive, on the same stream, as the host one returns first. */
  RCHECK(comm, ncclSend(ds, 100, ncclInt32, 1 - rank, comm, NULL));
  RCHECK(comm, ncclRecv(dr, 100, ncclInt32, 1 - rank, comm, NULL));
  RCHECK(comm, tbuf_result(comm, ncclSuccess));
  RASSERT(tbuf_get(comm, r, dr, sizeof r) == 0, "copy out");
  for (int i = 0; i < 100; i++)
    RASSERT(r[i] == value(1 - rank, rank, (size_t)i), "element %d", i);
  tbuf_free(ds);
  tbuf_free(dr);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int p2p_run(int n, rank_fn fn, size_t count, int socket) {
  struct p2p_cfg cfg = {.count = count, .socket = socket};
  if (socket) {
    setenv("NCCL_P2P_DISABLE", "1", 1);
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  return run_ranks(n, fn, &cfg);
}

TEST_IMPL(p2p_ring_shm_2) { return p2p_run(2, ring_rank, 0, 0); }
TEST_IMPL(p2p_ring_shm_5) { return p2p_run(5, ring_rank, 0, 0); }
TEST_IMPL(p2p_ring_socket_3) { return p2p_run(3, ring_rank, 0, 1); }
TEST_IMPL(p2p_alltoall_shm_4) { return p2p_run(4, alltoall_rank, 600000, 0); }
TEST_IMPL(p2p_alltoall_shm_8) { return p2p_run(8, alltoall_rank, 300000, 0); }
TEST_IMPL(p2p_alltoall_socket_4) { return p2p_run(4, alltoall_rank, 600000, 1); }
TEST_IMPL(p2p_ordered_shm) { return p2p_run(2, ordered_rank, 0, 0); }
TEST_IMPL(p2p_ordered_socket) { return p2p_run(2, ordered_rank, 0, 1); }
TEST_IMPL(p2p_blocking_pair) { return p2p_run(2, blocking_rank, 0, 0); }

/* Sends to oneself pair with receives from oneself in call order; an
 * unmatched one is refused before anything runs. */
TEST_IMPL(p2p_self) {
  ncclComm_t comm;
  int dev = 0;
  ASSERT_OK(ncclCommInitAll(&comm, 1, &dev));
  int32_t a[1000], b[1000], c[10], d[10];
  for (int i = 0; i < 1000; i++)
    a[i] = i * 3;
  for (int i = 0; i < 10; i++)
    c[i] = -i;
  /* The same layout in the communicator's memory. */
  int32_t *da = tbuf_alloc(comm, sizeof a), *db = tbuf_alloc(comm, sizeof b), *dc = tbuf_alloc(comm, sizeof c),
          *dd = tbuf_alloc(comm, sizeof d);
  ASSERT(da && db && dc && dd);
  ASSERT(tbuf_put(comm, da, a, sizeof a) == 0 && tbuf_put(comm, dc, c, sizeof c) == 0);
  ASSERT(tbuf_set(comm, db, 0, sizeof b) == 0 && tbuf_set(comm, dd, 0, sizeof d) == 0);
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclSend(da, 1000, ncclInt32, 0, comm, NULL));
  ASSERT_OK(ncclSend(dc, 10, ncclInt32, 0, comm, NULL));
  ASSERT_OK(ncclRecv(db, 1000, ncclInt32, 0, comm, NULL));
  ASSERT_OK(ncclRecv(dd, 10, ncclInt32, 0, comm, NULL));
  ASSERT_OK(ncclGroupEnd());
  ASSERT_OK(tbuf_result(comm, ncclSuccess));
  ASSERT(tbuf_get(comm, b, db, sizeof b) == 0 && tbuf_get(comm, d, dd, sizeof d) == 0);
  for (int i = 0; i < 1000; i++)
    ASSERT(b[i] == i * 3);
  for (int i = 0; i < 10; i++)
    ASSERT(d[i] == -i);
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclSend(da, 1000, ncclInt32, 0, comm, NULL));
  ASSERT(ncclGroupEnd() == ncclInvalidUsage);
  ASSERT_MSG(strstr(ncclGetLastError(comm), "send(s) to itself") != NULL, "%s", ncclGetLastError(comm));
  ASSERT_OK(ncclCommDestroy(comm));
  tbuf_free(da);
  tbuf_free(db);
  tbuf_free(dc);
  tbuf_free(dd);
  return 0;
}
