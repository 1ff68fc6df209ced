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
    for (size_t i = 0; i < c; i++)
      s[i] = value(rank, next, i);
    memset(r, 0, c * 4 + 4);
    RCHECK(comm, ncclGroupStart());
    RCHECK(comm, ncclSend(s, c, ncclInt32, next, comm, NULL));
    RCHECK(comm, ncclRecv(r, c, ncclInt32, prev, comm, NULL));
    RCHECK(comm, ncclGroupEnd());
    for (size_t i = 0; i < c; i++)
      RASSERT(r[i] == value(prev, rank, i), "count %zu: element %zu from rank %d is %d, expected %d", c, i, prev,
              r[i], value(prev, rank, i));
    free(s);
    free(r);
  }
  const char *tr;
  RCHECK(comm, loomCommPeerTransport(comm, next, &tr));
  RASSERT(strcmp(tr, cfg->socket ? "net/socket" : "shm") == 0, "reached rank %d over %s", next, tr);
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
  RASSERT(s && r, "out of memory");
  for (int round = 0; round < 2; round++) {
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < c; i++)
        s[(size_t)p * c + i] = value(rank, p, i + (size_t)round);
    memset(r, 0xff, c * 4 * n);
    RCHECK(comm, ncclGroupStart());
    for (int p = 0; p < n; p++) {
      RCHECK(comm, ncclSend(s + (size_t)p * c, c, ncclInt32, p, comm, NULL));
      RCHECK(comm, ncclRecv(r + (size_t)p * c, c, ncclInt32, p, comm, NULL));
    }
    RCHECK(comm, ncclGroupEnd());
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < c; i++)
        RASSERT(r[(size_t)p * c + i] == value(p, rank, i + (size_t)round), "round %d: block from rank %d element %zu",
                round, p, i);
  }
  free(s);
  free(r);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* Several messages between the same pair in one group arrive in order. */
static int ordered_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  enum { M = 5, C = 70000 };
  int32_t *buf = malloc((size_t)M * C * 4);
  int peer = rank ^ 1;
  RCHECK(comm, ncclGroupStart());
  for (int m = 0; m < M; m++) {
    int32_t *b = buf + (size_t)m * C;
    if (rank == 0) {
      for (size_t i = 0; i < C; i++)
        b[i] = value(m, 0, i);
      RCHECK(comm, ncclSend(b, C - m, ncclInt32, peer, comm, NULL));
    } else {
      RCHECK(comm, ncclRecv(b, C - m, ncclInt32, peer, comm, NULL));
    }
  }
  RCHECK(comm, ncclGroupEnd());
  if (rank == 1)
    for (int m = 0; m < M; m++)
      for (size_t i = 0; i < (size_t)(C - m); i++)
        RASSERT(buf[(size_t)m * C + i] == value(m, 0, i), "message %d element %zu out of order", m, i);
  free(buf);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* Sends outside a group, as NCCL allows when the peer's matching call
 * comes later: small messages are buffered by the FIFO. */
static int blocking_rank(int rank, int n, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int32_t s[100], r[100];
  for (int i = 0; i < 100; i++)
    s[i] = value(rank, 1 - rank, (size_t)i);
  RCHECK(comm, ncclSend(s, 100, ncclInt32, 1 - rank, comm, NULL));
  RCHECK(comm, ncclRecv(r, 100, ncclInt32, 1 - rank, comm, NULL));
  for (int i = 0; i < 100; i++)
    RASSERT(r[i] == value(1 - rank, rank, (size_t)i), "element %d", i);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int p2p_run(int n, rank_fn fn, size_t count, int socket) {
  struct p2p_cfg cfg = {.count = count, .socket = socket};
  if (socket) {
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
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclSend(a, 1000, ncclInt32, 0, comm, NULL));
  ASSERT_OK(ncclSend(c, 10, ncclInt32, 0, comm, NULL));
  ASSERT_OK(ncclRecv(b, 1000, ncclInt32, 0, comm, NULL));
  ASSERT_OK(ncclRecv(d, 10, ncclInt32, 0, comm, NULL));
  ASSERT_OK(ncclGroupEnd());
  for (int i = 0; i < 1000; i++)
    ASSERT(b[i] == i * 3);
  for (int i = 0; i < 10; i++)
    ASSERT(d[i] == -i);
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclSend(a, 1000, ncclInt32, 0, comm, NULL));
  ASSERT(ncclGroupEnd() == ncclInvalidUsage);
  ASSERT_MSG(strstr(ncclGetLastError(comm), "send(s) to itself") != NULL, "%s", ncclGetLastError(comm));
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}
