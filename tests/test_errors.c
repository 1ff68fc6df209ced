/*
 * Bad input: every refused call must return the specific ncclResult_t and
 * leave a sentence in ncclGetLastError that names what was wrong, and an
 * argument error must not break the communicator it was made on. Bad
 * environment values are in test_errors_env.c.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "nccl.h"
#include "test.h"

/* Returns 1 when `r` is `want` and every keyword is in `msg`. */
static int expect_check(const char *file, int line, const char *call, ncclResult_t r, ncclResult_t want,
                        const char *msg, const char *const *kw) {
  if (r != want) {
    fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d (%s); last error: %s\n", file, line, call, (int)r,
            ncclGetErrorString(r), (int)want, ncclGetErrorString(want), msg ? msg : "(null)");
    return 0;
  }
  if (want == ncclSuccess)
    return 1;
  for (; *kw; kw++) {
    if (msg == NULL || strstr(msg, *kw) == NULL) {
      fprintf(stderr, "%s:%d: %s: the last error does not mention \"%s\": %s\n", file, line, call, *kw,
              msg ? msg : "(null)");
      return 0;
    }
  }
  return 1;
}

/* The message is read after the call: `comm` (or NULL) picks whose. */
#define EXPECT(comm, call, code, ...)                                                              \
  do {                                                                                             \
    ncclResult_t expect_r_ = (call);                                                               \
    const char *const expect_kw_[] = {__VA_ARGS__, NULL};                                          \
    if (!expect_check(__FILE__, __LINE__, #call, expect_r_, (code), ncclGetLastError(comm), expect_kw_)) \
      return 1;                                                                                    \
  } while (0)

/* A few formatted keywords at a time, for messages that quote values. */
static const char *S(const char *fmt, ...) {
  static char bufs[8][128];
  static int next;
  char *b = bufs[next++ % 8];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof bufs[0], fmt, ap);
  va_end(ap);
  return b;
}

enum { K_ALLREDUCE, K_REDUCE, K_REDUCESCATTER, K_ALLGATHER, K_BROADCAST, K_BCAST, K_SEND, K_RECV, K_COUNT };
static const char *kname[K_COUNT] = {"ncclAllReduce", "ncclReduce", "ncclReduceScatter", "ncclAllGather",
                                     "ncclBroadcast", "ncclBcast",  "ncclSend",          "ncclRecv"};

static int is_reduction(int k) { return k == K_ALLREDUCE || k == K_REDUCE || k == K_REDUCESCATTER; }

/* `where` is the root of rooted collectives and the peer of send/recv. */
static ncclResult_t call_k(int k, const void *s, void *r, size_t count, int dtype, int op, int where,
                           ncclComm_t comm, cudaStream_t stream) {
  ncclDataType_t t = (ncclDataType_t)dtype;
  ncclRedOp_t o = (ncclRedOp_t)op;
  switch (k) {
  case K_ALLREDUCE: return ncclAllReduce(s, r, count, t, o, comm, stream);
  case K_REDUCE: return ncclReduce(s, r, count, t, o, where, comm, stream);
  case K_REDUCESCATTER: return ncclReduceScatter(s, r, count, t, o, comm, stream);
  case K_ALLGATHER: return ncclAllGather(s, r, count, t, comm, stream);
  case K_BROADCAST: return ncclBroadcast(s, r, count, t, where, comm, stream);
  case K_BCAST: return ncclBcast(r, count, t, where, comm, stream);
  case K_SEND: return ncclSend(s, count, t, where, comm, stream);
  default: return ncclRecv(r, count, t, where, comm, stream);
  }
}

/* Buffers big enough for any call below with count <= 64 on 2 ranks; the
 * refused calls must never touch them. */
static float sbuf[256], rbuf[256];

/* The communicator still works: one AllReduce with a known answer. */
static int allreduce_ok(ncclComm_t comm, int rank, int nranks) {
  enum { N = 1000 };
  float *b = malloc(N * sizeof *b);
  for (int i = 0; i < N; i++)
    b[i] = (float)(rank + 1) + (float)(i % 5);
  RCHECK(comm, ncclAllReduce(b, b, N, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < N; i++) {
    float want = (float)(nranks * (nranks + 1) / 2) + (float)(nranks * (i % 5));
    RASSERT(b[i] == want, "after the errors, element %d is %g instead of %g", i, b[i], want);
  }
  free(b);
  return 0;
}

typedef int (*comm_fn)(ncclComm_t comm, int rank, int nranks);

static int with_comm(int rank, int nranks, ncclUniqueId id, void *arg) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));
  if (((comm_fn)arg)(comm, rank, nranks) != 0)
    return 1;
  if (allreduce_ok(comm, rank, nranks) != 0)
    return 1;
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* Argument checks are local, so both ranks make the same refused calls
 * and then one real collective. */
static int on_two_ranks(comm_fn fn) { return run_ranks(2, with_comm, (void *)fn); }

/* ---- buffers ---- */

/* Buffers that overlap without being in place are refused on the rank
 * that passes them, before anything moves; in place, as NCCL defines it
 * per collective, still runs. Rank 1 is the root of rooted calls, so
 * that rank 0's refused call is one whose buffers it does use. */
static int overlap(ncclComm_t comm, int rank, int nranks) {
  static float big[1024];
  const size_t n = 4;
  for (int k = 0; k < K_COUNT; k++) {
    if (k == K_BCAST || k == K_SEND || k == K_RECV)
      continue; /* one buffer each */
    /* A rank's refusal is its own: both ranks refuse here, each on its
     * own buffers, so no peer is left waiting. */
    int root = rank;
    EXPECT(comm, call_k(k, big, big + 1, n, ncclFloat, ncclSum, root, comm, NULL), ncclInvalidArgument, kname[k],
           "overlap", "not in place");
    EXPECT(comm, call_k(k, big + 1, big, n, ncclFloat, ncclSum, root, comm, NULL), ncclInvalidArgument, kname[k],
           "overlap");
  }
  /* Gathered and scattered sides: in place is this rank's block only. */
  float *mine = big + 64 + (size_t)rank * n, *other = big + 64 + (size_t)(1 - rank) * n;
  EXPECT(comm, ncclAllGather(other, big + 64, n, ncclFloat, comm, NULL), ncclInvalidArgument, "ncclAllGather",
         "overlap", "sendbuff == recvbuff + rank * sendcount", S("%p", (void *)mine));
  EXPECT(comm, ncclReduceScatter(big + 64, big + 65, n, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
         "ncclReduceScatter", "overlap", "recvbuff == sendbuff + rank * recvcount", "MPI's recvbuff == sendbuff",
         S("%p", (void *)mine));
  /* A buffer that ends where the other begins does not overlap. */
  for (int i = 0; i < 8; i++)
    big[i] = (float)(rank + 1);
  RCHECK(comm, ncclAllReduce(big, big + n, n, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++)
    RASSERT(big[n + i] == 3.0f && big[i] == (float)(rank + 1), "rank %d: element %zu of the adjacent AllReduce", rank,
            i);
  /* In place, every kind that has it. */
  RCHECK(comm, ncclAllReduce(big, big, n, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++)
    mine[i] = (float)(10 * rank + (int)i);
  RCHECK(comm, ncclAllGather(mine, big + 64, n, ncclFloat, comm, NULL));
  for (int q = 0; q < nranks; q++)
    for (size_t i = 0; i < n; i++)
      RASSERT(big[64 + (size_t)q * n + i] == (float)(10 * q + (int)i), "rank %d: in-place AllGather element %zu of %d",
              rank, i, q);
  RCHECK(comm, ncclReduceScatter(big + 64, mine, n, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++)
    RASSERT(mine[i] == (float)(10 * rank + (int)i) * 2, "rank %d: in-place ReduceScatter element %zu is %g", rank, i,
            mine[i]);
  /* MPI's in-place ReduceScatter: the result at the start of the input. */
  for (int q = 0; q < nranks; q++)
    for (size_t i = 0; i < n; i++)
      big[64 + (size_t)q * n + i] = (float)(q + 1);
  RCHECK(comm, ncclReduceScatter(big + 64, big + 64, n, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++)
    RASSERT(big[64 + i] == (float)(rank + 1) * (float)nranks, "rank %d: MPI-style in-place ReduceScatter element %zu "
            "is %g", rank, i, big[64 + i]);
  return 0;
}

TEST_IMPL(errors_overlap) { return on_two_ranks(overlap); }

/* ncclBcast has one buffer: errors_bcast_null_buff. */
static int null_buffers(ncclComm_t comm, int rank, int nranks) {
  for (int k = 0; k < K_COUNT; k++) {
    if (k == K_BCAST)
      continue;
    int where = k == K_SEND || k == K_RECV ? 1 - rank : rank; /* this rank is the root */
    if (k != K_RECV)
      EXPECT(comm, call_k(k, NULL, rbuf, 4, ncclFloat, ncclSum, where, comm, NULL), ncclInvalidArgument, kname[k],
             "sendbuff is NULL", "count 4");
    if (k != K_SEND)
      EXPECT(comm, call_k(k, sbuf, NULL, 4, ncclFloat, ncclSum, where, comm, NULL), ncclInvalidArgument, kname[k],
             "recvbuff is NULL", "count 4");
  }
  return 0;
}

TEST_IMPL(errors_null_buffers) { return on_two_ranks(null_buffers); }

/* ncclBcast's one argument is called buff: a sentence about sendbuff or
 * recvbuff sends the user looking for an argument they never passed.
 * The root reads it and a non-root writes it. */
static int bcast_null_buff(ncclComm_t comm, int rank, int nranks) {
  for (int root = 0; root < nranks; root++) {
    EXPECT(comm, ncclBcast(NULL, 4, ncclFloat, root, comm, NULL), ncclInvalidArgument, "ncclBcast", "buff is NULL",
           "count 4");
    const char *msg = ncclGetLastError(comm);
    RASSERT(strstr(msg, "sendbuff") == NULL && strstr(msg, "recvbuff") == NULL,
            "ncclBcast (root %d, this rank %d) has no sendbuff or recvbuff argument, but the error says: %s", root,
            rank, msg);
  }
  return 0;
}

TEST_IMPL(errors_bcast_null_buff) { return on_two_ranks(bcast_null_buff); }

/* Nothing is read or written with count 0, so NULL is fine; the sends and
 * receives pair up inside a group so that neither waits for the other. */
static int null_buffers_count0(ncclComm_t comm, int rank, int nranks) {
  for (int k = 0; k < K_SEND; k++)
    EXPECT(comm, call_k(k, NULL, NULL, 0, ncclFloat, ncclSum, 0, comm, NULL), ncclSuccess, "");
  RCHECK(comm, ncclGroupStart());
  EXPECT(comm, ncclSend(NULL, 0, ncclFloat, 1 - rank, comm, NULL), ncclSuccess, "");
  EXPECT(comm, ncclRecv(NULL, 0, ncclFloat, 1 - rank, comm, NULL), ncclSuccess, "");
  EXPECT(NULL, ncclGroupEnd(), ncclSuccess, "");
  return 0;
}

TEST_IMPL(errors_null_buffers_count0) { return on_two_ranks(null_buffers_count0); }

/* A non-root of Reduce has no result and a non-root of Broadcast no
 * input: NULL there is legal, and the root still gets the right data. */
static int null_nonroot(ncclComm_t comm, int rank, int nranks) {
  enum { N = 64 };
  float in[N], out[N];
  for (int i = 0; i < N; i++) {
    in[i] = (float)(rank + 1) * (float)i;
    out[i] = -1;
  }
  EXPECT(comm, ncclReduce(in, rank == 0 ? out : NULL, N, ncclFloat, ncclSum, 0, comm, NULL), ncclSuccess, "");
  for (int i = 0; rank == 0 && i < N; i++)
    RASSERT(out[i] == 3.0f * (float)i, "Reduce: element %d is %g, expected %g", i, out[i], 3.0f * (float)i);
  for (int i = 0; i < N; i++)
    out[i] = -1;
  EXPECT(comm, ncclBroadcast(rank == 0 ? in : NULL, out, N, ncclFloat, 0, comm, NULL), ncclSuccess, "");
  for (int i = 0; i < N; i++)
    RASSERT(out[i] == (float)i, "Broadcast: element %d on rank %d is %g, expected %d", i, rank, out[i], i);
  return 0;
}

TEST_IMPL(errors_null_nonroot) { return on_two_ranks(null_nonroot); }

/* ---- counts ---- */

static int count_overflow(ncclComm_t comm, int rank, int nranks) {
  const char *count = S("count %zu", (size_t)SIZE_MAX);
  for (int k = 0; k < K_COUNT; k++) {
    int where = k == K_SEND || k == K_RECV ? 1 - rank : 0;
    EXPECT(comm, call_k(k, sbuf, rbuf, SIZE_MAX, ncclFloat, ncclSum, where, comm, NULL), ncclInvalidArgument,
           kname[k], count, "overflows the address space");
    /* One-byte elements do not overflow the multiplication, only the
     * largest possible buffer. */
    EXPECT(comm, call_k(k, sbuf, rbuf, SIZE_MAX, ncclInt8, ncclSum, where, comm, NULL), ncclInvalidArgument,
           kname[k], count);
  }
  return 0;
}

TEST_IMPL(errors_count_overflow) { return on_two_ranks(count_overflow); }

/* 2^61 floats is 2^63 bytes: one rank's share fits in size_t, but the
 * gathered or scattered side of two ranks does not. */
static int count_times_nranks(ncclComm_t comm, int rank, int nranks) {
  size_t count = (size_t)1 << 61;
  const char *c = S("count %zu", count);
  EXPECT(comm, ncclAllGather(sbuf, rbuf, count, ncclFloat, comm, NULL), ncclInvalidArgument, "ncclAllGather", c,
         "times nranks");
  EXPECT(comm, ncclReduceScatter(sbuf, rbuf, count, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
         "ncclReduceScatter", c, "times nranks");
  /* 2^60 floats: the gathered side's byte count fits in size_t but not
   * in any pointer difference. */
  count = (size_t)1 << 60;
  EXPECT(comm, ncclAllGather(sbuf, rbuf, count, ncclFloat, comm, NULL), ncclInvalidArgument, "ncclAllGather",
         S("count %zu", count), "larger than any buffer");
  EXPECT(comm, ncclReduceScatter(sbuf, rbuf, count, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
         "ncclReduceScatter", S("count %zu", count), "larger than any buffer");
  return 0;
}

TEST_IMPL(errors_count_times_nranks) { return on_two_ranks(count_times_nranks); }

/* ---- datatype, op, root, peer, stream, comm ---- */

static int bad_datatype(ncclComm_t comm, int rank, int nranks) {
  static const int bad[] = {-1, ncclNumTypes, 99};
  for (int k = 0; k < K_COUNT; k++)
    for (int b = 0; b < 3; b++) {
      int where = k == K_SEND || k == K_RECV ? 1 - rank : 0;
      EXPECT(comm, call_k(k, sbuf, rbuf, 4, bad[b], ncclSum, where, comm, NULL), ncclInvalidArgument, kname[k],
             S("datatype %d", bad[b]), "ncclDataType_t");
    }
  return 0;
}

TEST_IMPL(errors_datatype) { return on_two_ranks(bad_datatype); }

static int bad_op(ncclComm_t comm, int rank, int nranks) {
  /* 5 is the first value ncclRedOpCreatePreMulSum hands out: none was. */
  static const int bad[] = {-1, ncclNumOps, 99};
  for (int k = 0; k < K_COUNT; k++)
    for (int b = 0; is_reduction(k) && b < 3; b++)
      EXPECT(comm, call_k(k, sbuf, rbuf, 4, ncclFloat, bad[b], 0, comm, NULL), ncclInvalidArgument, kname[k],
             S("op %d", bad[b]));
  return 0;
}

TEST_IMPL(errors_op) { return on_two_ranks(bad_op); }

static int bad_root(ncclComm_t comm, int rank, int nranks) {
  static const int ks[] = {K_BROADCAST, K_REDUCE, K_BCAST};
  for (int i = 0; i < 3; i++) {
    EXPECT(comm, call_k(ks[i], sbuf, rbuf, 4, ncclFloat, ncclSum, -1, comm, NULL), ncclInvalidArgument,
           kname[ks[i]], "root -1", S("%d ranks", nranks));
    EXPECT(comm, call_k(ks[i], sbuf, rbuf, 4, ncclFloat, ncclSum, nranks, comm, NULL), ncclInvalidArgument,
           kname[ks[i]], S("root %d", nranks), S("%d ranks", nranks));
  }
  return 0;
}

TEST_IMPL(errors_root) { return on_two_ranks(bad_root); }

static int bad_peer(ncclComm_t comm, int rank, int nranks) {
  for (int k = K_SEND; k <= K_RECV; k++) {
    EXPECT(comm, call_k(k, sbuf, rbuf, 4, ncclFloat, ncclSum, -1, comm, NULL), ncclInvalidArgument, kname[k],
           "peer -1", S("%d ranks", nranks));
    EXPECT(comm, call_k(k, sbuf, rbuf, 4, ncclFloat, ncclSum, nranks, comm, NULL), ncclInvalidArgument, kname[k],
           S("peer %d", nranks), S("%d ranks", nranks));
  }
  return 0;
}

TEST_IMPL(errors_peer) { return on_two_ranks(bad_peer); }

static int bad_stream(ncclComm_t comm, int rank, int nranks) {
  int dummy;
  cudaStream_t stream = (cudaStream_t)(void *)&dummy;
  for (int k = 0; k < K_COUNT; k++) {
    int where = k == K_SEND || k == K_RECV ? 1 - rank : 0;
    EXPECT(comm, call_k(k, sbuf, rbuf, 4, ncclFloat, ncclSum, where, comm, stream), ncclInvalidArgument, kname[k],
           "stream must be NULL", "host communicator");
  }
  return 0;
}

TEST_IMPL(errors_stream) { return on_two_ranks(bad_stream); }

TEST_IMPL(errors_null_comm) {
  for (int k = 0; k < K_COUNT; k++)
    EXPECT(NULL, call_k(k, sbuf, rbuf, 4, ncclFloat, ncclSum, 0, NULL, NULL), ncclInvalidArgument,
           S("%s: comm is NULL", kname[k]));
  int n;
  EXPECT(NULL, ncclCommCount(NULL, &n), ncclInvalidArgument, "ncclCommCount", "comm is NULL");
  ncclComm_t child;
  EXPECT(NULL, ncclCommSplit(NULL, 0, 0, &child, NULL), ncclInvalidArgument, "ncclCommSplit", "comm is NULL");
  ncclRedOp_t op;
  float scalar = 1;
  EXPECT(NULL, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, NULL), ncclInvalidArgument,
         "ncclRedOpCreatePreMulSum", "comm is NULL");
  return 0;
}

/* ---- communicator creation ---- */

TEST_IMPL(errors_init_args) {
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = (ncclComm_t)(void *)&id;
  EXPECT(NULL, ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, "ncclCommInitRank", "nranks is 0");
  ASSERT_MSG(comm == NULL, "a failed init left %p in *comm", (void *)comm);
  EXPECT(NULL, ncclCommInitRank(&comm, -3, id, 0), ncclInvalidArgument, "nranks is -3");
  EXPECT(NULL, ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument, "rank -1", "nranks 2");
  EXPECT(NULL, ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument, "rank 2", "nranks 2");
  EXPECT(NULL, ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument, "comm pointer is NULL");
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  EXPECT(NULL, ncclCommInitRank(&comm, 1, zero, 0), ncclInvalidArgument, "unique id", "ncclGetUniqueId");
  /* None of that reached the bootstrap root: the id is still good. */
  ASSERT_OK(ncclCommInitRank(&comm, 1, id, 0));
  if (allreduce_ok(comm, 0, 1) != 0)
    return 1;
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(errors_init_config) {
  /* config.netName must name the plugin the process uses: Socket here,
   * whatever the machine has (test_net_ib.c tries IB). */
  setenv("NCCL_NET", "Socket", 1);
  ncclUniqueId id;
  ASSERT_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0x12345678;
  EXPECT(NULL, ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER",
         "0x12345678");
  ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
  cfg2.blocking = 7;
  EXPECT(NULL, ncclCommInitRankConfig(&comm, 1, id, 0, &cfg2), ncclInvalidArgument, "blocking is 7");
  ncclConfig_t cfg3 = NCCL_CONFIG_INITIALIZER;
  cfg3.netName = "Bogus";
  EXPECT(NULL, ncclCommInitRankConfig(&comm, 1, id, 0, &cfg3), ncclInvalidArgument, "netName", "\"Bogus\"",
         "Socket");
  cfg3.netName = "IB";
  EXPECT(NULL, ncclCommInitRankConfig(&comm, 1, id, 0, &cfg3), ncclInvalidUsage, "config.netName \"IB\"",
         "uses NET/Socket", "NCCL_NET=IB");
  ncclConfig_t cfg4 = NCCL_CONFIG_INITIALIZER;
  cfg4.size = 3;
  EXPECT(NULL, ncclCommInitRankConfig(&comm, 1, id, 0, &cfg4), ncclInvalidArgument, "config.size 3");
  ASSERT(comm == NULL);
  ncclConfig_t good = NCCL_CONFIG_INITIALIZER;
  good.blocking = 1;
  good.netName = "socket"; /* the plugin NCCL_NET chose, whatever the case */
  ASSERT_OK(ncclCommInitRankConfig(&comm, 1, id, 0, &good));
  if (allreduce_ok(comm, 0, 1) != 0)
    return 1;
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

/* ---- groups ---- */

TEST_IMPL(errors_group_end_without_start) {
  EXPECT(NULL, ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd", "without a matching ncclGroupStart");
  /* Balanced groups still work after that. */
  ASSERT_OK(ncclGroupStart());
  ASSERT_OK(ncclGroupEnd());
  return 0;
}

/* One refused call fails the whole group on every rank, so no rank runs
 * half of it and none waits for a partner that ran nothing. */
static int group_runs_nothing(ncclComm_t comm, int rank, int nranks) {
  enum { N = 32 };
  float in[N], out[N];
  for (int i = 0; i < N; i++) {
    in[i] = 1.0f;
    out[i] = -7.0f;
  }
  RCHECK(comm, ncclGroupStart());
  EXPECT(comm, ncclAllReduce(in, out, N, ncclFloat, ncclSum, comm, NULL), ncclSuccess, "");
  EXPECT(comm, ncclAllReduce(in, out, N, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument,
         "datatype 99");
  EXPECT(NULL, ncclGroupEnd(), ncclInvalidArgument, "ran nothing", "datatype 99");
  for (int i = 0; i < N; i++)
    RASSERT(out[i] == -7.0f, "the queued AllReduce ran: out[%d] is %g", i, out[i]);
  return 0;
}

TEST_IMPL(errors_group_runs_nothing) { return on_two_ranks(group_runs_nothing); }

/* ---- PreMulSum operators ---- */

static int premulsum_create(ncclComm_t comm, int rank, int nranks) {
  ncclRedOp_t op;
  float scalar = 2.0f;
  EXPECT(comm, ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat, ncclScalarHostImmediate, comm), ncclInvalidArgument,
         "ncclRedOpCreatePreMulSum", "scalar is NULL");
  EXPECT(comm, ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat, ncclScalarHostImmediate, comm),
         ncclInvalidArgument, "ncclRedOpCreatePreMulSum", "op is NULL");
  EXPECT(comm, ncclRedOpCreatePreMulSum(&op, &scalar, (ncclDataType_t)99, ncclScalarHostImmediate, comm),
         ncclInvalidArgument, "ncclRedOpCreatePreMulSum", "datatype 99");
  EXPECT(comm, ncclRedOpCreatePreMulSum(&op, &scalar, (ncclDataType_t)-1, ncclScalarHostImmediate, comm),
         ncclInvalidArgument, "ncclRedOpCreatePreMulSum", "datatype -1");
  EXPECT(comm, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, (ncclScalarResidence_t)7, comm),
         ncclInvalidArgument, "ncclRedOpCreatePreMulSum", "residence 7");
  return 0;
}

TEST_IMPL(errors_premulsum_create) { return on_two_ranks(premulsum_create); }

static int premulsum_dtype(ncclComm_t comm, int rank, int nranks) {
  ncclRedOp_t op;
  float scalar = 2.0f;
  RCHECK(comm, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  double d[4] = {1, 2, 3, 4};
  EXPECT(comm, ncclAllReduce(d, d, 4, ncclDouble, op, comm, NULL), ncclInvalidArgument, "ncclAllReduce",
         "created for float", "uses double");
  EXPECT(comm, ncclReduce(d, d, 4, ncclDouble, op, 0, comm, NULL), ncclInvalidArgument, "ncclReduce",
         "created for float", "uses double");
  /* The operator itself is fine with the type it was made for. */
  float f[4] = {1, 2, 3, 4};
  RCHECK(comm, ncclAllReduce(f, f, 4, ncclFloat, op, comm, NULL));
  for (int i = 0; i < 4; i++)
    RASSERT(f[i] == 2.0f * nranks * (float)(i + 1), "PreMulSum: element %d is %g", i, f[i]);
  RCHECK(comm, ncclRedOpDestroy(op, comm));
  return 0;
}

TEST_IMPL(errors_premulsum_dtype) { return on_two_ranks(premulsum_dtype); }

static int redop_destroy(ncclComm_t comm, int rank, int nranks) {
  EXPECT(comm, ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument, "ncclRedOpDestroy", "op 0", "built-in");
  EXPECT(comm, ncclRedOpDestroy(ncclAvg, comm), ncclInvalidArgument, "ncclRedOpDestroy", "op 4", "built-in");
  ncclRedOp_t op;
  float scalar = 2.0f;
  RCHECK(comm, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  RCHECK(comm, ncclRedOpDestroy(op, comm));
  EXPECT(comm, ncclRedOpDestroy(op, comm), ncclInvalidArgument, "ncclRedOpDestroy", S("op %d", (int)op),
         "destroyed");
  float f[4] = {1, 2, 3, 4};
  EXPECT(comm, ncclAllReduce(f, f, 4, ncclFloat, op, comm, NULL), ncclInvalidArgument, "ncclAllReduce",
         S("op %d", (int)op));
  return 0;
}

TEST_IMPL(errors_redop_destroy) { return on_two_ranks(redop_destroy); }

/* A negative value is no operator at all, built-in or not. */
static int redop_destroy_negative(ncclComm_t comm, int rank, int nranks) {
  EXPECT(comm, ncclRedOpDestroy((ncclRedOp_t)-1, comm), ncclInvalidArgument, "ncclRedOpDestroy", "op -1");
  RASSERT(strstr(ncclGetLastError(comm), "built-in") == NULL, "op -1 is not a built-in operator, but: %s",
          ncclGetLastError(comm));
  return 0;
}

TEST_IMPL(errors_redop_destroy_negative) { return on_two_ranks(redop_destroy_negative); }

/* ---- a simulated group ---- */

/* ncclGroupSimulateEnd estimates the group from the cost model, runs none
 * of it (the buffers keep their values), and closes the group. */
static int group_simulate(ncclComm_t comm, int rank, int nranks) {
  enum { N = 1 << 20 };
  float *b = malloc(N * sizeof(float));
  RASSERT(b != NULL, "out of memory");
  for (int i = 0; i < N; i++)
    b[i] = (float)(rank + 1);
  ncclSimInfo_t small = NCCL_SIM_INFO_INITIALIZER, big = NCCL_SIM_INFO_INITIALIZER;
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclAllReduce(b, b, 1024, ncclFloat, ncclSum, comm, NULL));
  RCHECK(comm, ncclGroupSimulateEnd(&small));
  RCHECK(comm, ncclGroupStart());
  RCHECK(comm, ncclAllReduce(b, b, N, ncclFloat, ncclSum, comm, NULL));
  RCHECK(comm, ncclSend(b, N, ncclFloat, 1 - rank, comm, NULL));
  RCHECK(comm, ncclRecv(b, N, ncclFloat, 1 - rank, comm, NULL));
  RCHECK(comm, ncclGroupSimulateEnd(&big));
  RASSERT(small.estimatedTime > 0 && big.estimatedTime > small.estimatedTime,
          "estimated %g us for 4 KiB, %g us for 4 MiB and a send", small.estimatedTime, big.estimatedTime);
  for (int i = 0; i < N; i++)
    RASSERT(b[i] == (float)(rank + 1), "element %d is %g: the simulated group ran", i, b[i]);
  /* The simulated group is closed, not left open. */
  EXPECT(NULL, ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart");
  ncclSimInfo_t bad = {0};
  RCHECK(comm, ncclGroupStart());
  EXPECT(NULL, ncclGroupSimulateEnd(&bad), ncclInvalidArgument, "ncclGroupSimulateEnd", "NCCL_SIM_INFO_INITIALIZER");
  EXPECT(NULL, ncclGroupSimulateEnd(&small), ncclInvalidUsage, "without a matching ncclGroupStart");
  /* And the communicator still works. */
  RCHECK(comm, ncclAllReduce(b, b, N, ncclFloat, ncclSum, comm, NULL));
  RASSERT(b[0] == 3.0f && b[N - 1] == 3.0f, "the sum is %g", b[0]);
  free(b);
  return 0;
}

TEST_IMPL(errors_group_simulate) { return on_two_ranks(group_simulate); }

TEST_IMPL(errors_init_scalable) {
  ncclUniqueId ids[2];
  ASSERT_OK(ncclGetUniqueId(&ids[0]));
  ASSERT_OK(ncclGetUniqueId(&ids[1]));
  ncclComm_t comm = NULL;
  EXPECT(NULL, ncclCommInitRankScalable(&comm, 1, 0, 2, ids, NULL), ncclInvalidArgument, "ncclCommInitRankScalable",
         "nId is 2 but nranks is 1");
  EXPECT(NULL, ncclCommInitRankScalable(&comm, 1, 0, 0, ids, NULL), ncclInvalidArgument, "ncclCommInitRankScalable",
         "nId (0)");
  /* The one-id form is ncclCommInitRankConfig. */
  ASSERT_OK(ncclCommInitRankScalable(&comm, 1, 0, 1, ids, NULL));
  if (allreduce_ok(comm, 0, 1) != 0)
    return 1;
  ASSERT_OK(ncclCommDestroy(comm));
  return 0;
}

/* ---- teardown and strings ---- */

TEST_IMPL(errors_teardown_null) {
  ASSERT_OK(ncclCommDestroy(NULL));
  ASSERT_OK(ncclCommAbort(NULL));
  return 0;
}

TEST_IMPL(errors_error_strings) {
  const char *s[ncclNumResults + 1];
  for (int r = 0; r < ncclNumResults; r++)
    s[r] = ncclGetErrorString((ncclResult_t)r);
  s[ncclNumResults] = ncclGetErrorString((ncclResult_t)1234);
  for (int i = 0; i <= ncclNumResults; i++) {
    ASSERT_MSG(s[i] != NULL && s[i][0] != '\0', "ncclGetErrorString(%d) is empty", i);
    for (int j = 0; j < i; j++)
      ASSERT_MSG(strcmp(s[i], s[j]) != 0, "results %d and %d share the string \"%s\"", j, i, s[i]);
  }
  ASSERT(ncclGetErrorString((ncclResult_t)-1) != NULL);
  ASSERT(ncclGetErrorString(ncclNumResults) != NULL);
  return 0;
}
