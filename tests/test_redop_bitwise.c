/*
 * Loom's bitwise reductions (loomBand, loomBor, loomBxor, include/loom.h):
 * AllReduce, Reduce and ReduceScatter with each operator on each integer
 * type, on 2, 3 and 4 host ranks over shm and over sockets, with each
 * algorithm forced and over several channels, against a reference computed
 * here from random bits; then what is refused (floats, CUDA communicators,
 * op values nobody defined) and ranks that disagree on the operator.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

enum { C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, C_COUNT };
static const char *cname[] = {"AllReduce", "Reduce", "ReduceScatter"};
static const ncclRedOp_t ops[] = {loomBand, loomBor, loomBxor};
static const char *opname[] = {"band", "bor", "bxor"};
static const ncclDataType_t itypes[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64};
static const ncclDataType_t ftypes[] = {ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3,
                                        ncclFloat8e5m2};

/* About 1.5 MB: above a channel's half megabyte on two and three channels,
 * and many FIFO slots per rank and channel. */
#define LARGE_BYTES (3u << 19)

static size_t esize(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclUint8 ? 1 : t == ncclInt32 || t == ncclUint32 ? 4 : 8;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* Rank r's element i of the call with `seed`: random bits, but biased per
 * operator so that AND and OR of four ranks do not end in all zeros or all
 * ones (which a wrong operator could also produce). */
static uint64_t input(uint64_t seed, int op, int r, size_t i) {
  uint64_t x = mix(seed ^ mix(((uint64_t)r << 40) + i));
  uint64_t y = mix(x);
  return op == 0 ? x | y : op == 1 ? x & y : x;
}

static void store(void *buf, size_t i, size_t es, uint64_t v) { memcpy((char *)buf + i * es, &v, es); }

static uint64_t load(const void *buf, size_t i, size_t es) {
  uint64_t v = 0;
  memcpy(&v, (const char *)buf + i * es, es);
  return v;
}

static uint64_t reference(uint64_t seed, int op, int n, size_t i, size_t es) {
  uint64_t v = input(seed, op, 0, i);
  for (int r = 1; r < n; r++) {
    uint64_t x = input(seed, op, r, i);
    v = op == 0 ? v & x : op == 1 ? v | x : v ^ x;
  }
  return es == 8 ? v : v & ((1ull << (8 * es)) - 1);
}

static ncclResult_t call(int coll, const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                         ncclComm_t comm) {
  switch (coll) {
  case C_ALLREDUCE: return ncclAllReduce(s, r, count, t, op, comm, NULL);
  case C_REDUCE: return ncclReduce(s, r, count, t, op, root, comm, NULL);
  default: return ncclReduceScatter(s, r, count, t, op, comm, NULL);
  }
}

/* One call and its check; out-of-place buffers deliberately misaligned. */
static int run_one(ncclComm_t comm, int rank, int n, int coll, int ti, int opi, size_t count, int inplace,
                   char *pool, size_t pool_bytes) {
  ncclDataType_t t = itypes[ti];
  size_t es = esize(t);
  size_t send_n = coll == C_REDUCESCATTER ? count * n : count;
  uint64_t seed = ((uint64_t)coll << 48) ^ ((uint64_t)ti << 40) ^ ((uint64_t)opi << 36) ^ ((uint64_t)inplace << 32) ^
                  count;
  int root = (int)(count % (size_t)n);
  char *sendbuf = inplace ? pool : pool + 1 + rank % 3;
  char *recvbuf = inplace ? pool : pool + ((send_n * es + 64 + 63) & ~(size_t)63) + 3;
  if (inplace && coll == C_REDUCESCATTER && count % 2 == 1)
    recvbuf = sendbuf + (size_t)rank * count * es; /* NCCL's in-place form; MPI's for even counts */
  RASSERT((size_t)(recvbuf - pool) + send_n * es + 8 <= pool_bytes, "pool too small");
  for (size_t i = 0; i < send_n; i++)
    store(sendbuf, i, es, input(seed, opi, rank, i));
  if (!inplace)
    memset(recvbuf, 0xa5, count * es);
  RCHECK(comm, call(coll, sendbuf, recvbuf, count, t, ops[opi], root, comm));
  if (coll == C_REDUCE && rank != root)
    return 0;
  size_t first = coll == C_REDUCESCATTER ? (size_t)rank * count : 0;
  for (size_t i = 0; i < count; i++) {
    uint64_t want = reference(seed, opi, n, first + i, es), got = load(recvbuf, i, es);
    RASSERT(got == want,
            "rank %d of %d: %s(count %zu, type %d, %s, root %d, %s): element %zu is 0x%llx, expected 0x%llx", rank,
            n, cname[coll], count, (int)t, opname[opi], root, inplace ? "in place" : "out of place", i,
            (unsigned long long)got, (unsigned long long)want);
  }
  return 0;
}

static int matrix_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const char *expect = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int is_host = 0;
  RCHECK(comm, loomCommIsHost(comm, &is_host));
  RASSERT(is_host, "rank %d: LOOM_DEVICE=host gave a CUDA communicator", rank);
  size_t pool_bytes = (size_t)LARGE_BYTES * 2 + 4096;
  char *pool = malloc(pool_bytes);
  RASSERT(pool, "out of memory");
  int calls = 0;
  for (int coll = 0; coll < C_COUNT; coll++)
    for (int ti = 0; ti < 6; ti++)
      for (int opi = 0; opi < 3; opi++)
        for (int k = 0; k < 4; k++) {
          size_t es = esize(itypes[ti]);
          size_t large = LARGE_BYTES / es + 3;
          size_t count = k == 0 ? 1 : k == 1 ? 7 : k == 2 ? 4099 : coll == C_REDUCESCATTER ? (large / n) | 1 : large;
          for (int inplace = 0; inplace < 2; inplace++, calls++)
            if (run_one(comm, rank, n, coll, ti, opi, count, inplace, pool, pool_bytes)) {
              free(pool);
              return 1;
            }
        }
  free(pool);
  /* Whichever peers the algorithms connected, all over the expected
   * transport. */
  int connected = 0;
  for (int q = 0; q < n; q++) {
    const char *tr = NULL;
    if (q == rank)
      continue;
    RCHECK(comm, loomCommPeerTransport(comm, q, &tr));
    if (strcmp(tr, "none") == 0)
      continue;
    connected++;
    RASSERT(strcmp(tr, expect) == 0, "rank %d reached rank %d over %s, expected %s", rank, q, tr, expect);
  }
  RASSERT(connected > 0, "rank %d connected to no peer", rank);
  int nch = 0;
  RCHECK(comm, loomCommChannels(comm, &nch));
  const char *want = getenv("NCCL_MIN_NCHANNELS");
  RASSERT(!want || nch == atoi(want), "rank %d has %d channels, not NCCL_MIN_NCHANNELS=%s", rank, nch, want);
  if (rank == 0)
    printf("%d ranks over %s, %d channel(s), NCCL_ALGO=%s: %d calls checked\n", n, expect, nch,
           getenv("NCCL_ALGO") ? getenv("NCCL_ALGO") : "(tuner)", calls);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

/* algo: an NCCL_ALGO value or NULL; nch: channels forced, or 0. */
static int matrix(int n, int socket, const char *algo, int nch) {
  setenv("LOOM_DEVICE", "host", 1);
  if (socket) {
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  if (algo)
    setenv("NCCL_ALGO", algo, 1);
  if (nch) {
    char v[8];
    snprintf(v, sizeof v, "%d", nch);
    setenv("NCCL_MIN_NCHANNELS", v, 1);
    setenv("NCCL_MAX_NCHANNELS", v, 1);
  }
  return run_ranks(n, matrix_rank, socket ? "net/socket" : "shm");
}

TEST_IMPL(redop_bitwise_shm_2) { return matrix(2, 0, NULL, 0); }
TEST_IMPL(redop_bitwise_shm_3) { return matrix(3, 0, NULL, 0); }
TEST_IMPL(redop_bitwise_shm_4) { return matrix(4, 0, NULL, 0); }
TEST_IMPL(redop_bitwise_socket_2) { return matrix(2, 1, NULL, 0); }
TEST_IMPL(redop_bitwise_socket_3) { return matrix(3, 1, NULL, 0); }
TEST_IMPL(redop_bitwise_socket_4) { return matrix(4, 1, NULL, 0); }
/* Each AllReduce algorithm forced (recursive doubling where the buffer
 * fits a FIFO, rings above); Reduce and ReduceScatter have rings only. */
TEST_IMPL(redop_bitwise_ring_shm_3) { return matrix(3, 0, "ring", 0); }
TEST_IMPL(redop_bitwise_tree_shm_3) { return matrix(3, 0, "allreduce:tree", 0); }
TEST_IMPL(redop_bitwise_tree_shm_4) { return matrix(4, 0, "allreduce:tree", 0); }
TEST_IMPL(redop_bitwise_tree_socket_4) { return matrix(4, 1, "allreduce:tree", 0); }
TEST_IMPL(redop_bitwise_rd_shm_2) { return matrix(2, 0, "allreduce:recursivedoubling,ring", 0); }
TEST_IMPL(redop_bitwise_rd_shm_3) { return matrix(3, 0, "allreduce:recursivedoubling,ring", 0); }
TEST_IMPL(redop_bitwise_rd_socket_4) { return matrix(4, 1, "allreduce:recursivedoubling,ring", 0); }
/* The large calls split over channels (trees: both trees of the double
 * tree on each). */
TEST_IMPL(redop_bitwise_channels_shm_3) { return matrix(3, 0, NULL, 3); }
TEST_IMPL(redop_bitwise_channels_socket_2) { return matrix(2, 1, NULL, 2); }
TEST_IMPL(redop_bitwise_channels_tree_shm_4) { return matrix(4, 0, "allreduce:tree", 2); }

/* ---- refusals ---- */

#define EXPECT_REFUSED(comm, callexpr, code, words)                                                         \
  do {                                                                                                      \
    ncclResult_t r_ = (callexpr);                                                                           \
    const char *m_ = ncclGetLastError(comm);                                                                \
    RASSERT(r_ == (code), "%s returned %d (%s), expected %d: %s", #callexpr, (int)r_, ncclGetErrorString(r_), \
            (int)(code), m_);                                                                               \
    for (const char *const *w_ = (words); *w_; w_++)                                                        \
      RASSERT(strstr(m_, *w_), "%s: the error does not mention \"%s\": %s", #callexpr, *w_, m_);             \
  } while (0)

static int refused_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int is_host = 0;
  RCHECK(comm, loomCommIsHost(comm, &is_host));
  RASSERT(is_host, "LOOM_DEVICE=host gave a CUDA communicator");
  uint64_t in[8] = {0x0f, 0xf0, 3}, out[8 * 4] = {0};
  static const char *names[] = {"loomBand", "loomBor", "loomBxor"};
  /* Floats: a sentence naming the operator and the type; nothing moves. */
  for (int coll = 0; coll < C_COUNT; coll++)
    for (int f = 0; f < 6; f++)
      for (int o = 0; o < 3; o++) {
        const char *w[] = {names[o], "integer datatypes only", cname[coll], NULL};
        EXPECT_REFUSED(comm, call(coll, in, out, 2, ftypes[f], ops[o], 0, comm), ncclInvalidArgument, w);
      }
  /* Values in the reserved range that are no operator (yet), one between
   * the PreMulSum handles and that range, and ncclMaxRedOp itself. */
  static const int bad[] = {(int)loomBxor + 1, 0x7ffffffe, 0x7fffffff, 0x7fffffef, 1000};
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
    char num[16];
    snprintf(num, sizeof num, "op %d", bad[b]);
    const char *w[] = {num, "neither a built-in", NULL};
    EXPECT_REFUSED(comm, ncclAllReduce(in, out, 2, ncclInt32, (ncclRedOp_t)bad[b], comm, NULL),
                   ncclInvalidArgument, w);
  }
  /* PreMulSum handles stay below the reserved range, and Loom's
   * operators are nothing to destroy. */
  int32_t scalar = 2;
  ncclRedOp_t pm;
  RCHECK(comm, ncclRedOpCreatePreMulSum(&pm, &scalar, ncclInt32, ncclScalarHostImmediate, comm));
  RASSERT((int)pm >= ncclNumOps && (int)pm < (int)loomBand, "PreMulSum handle %d", (int)pm);
  RCHECK(comm, ncclRedOpDestroy(pm, comm));
  for (int o = 0; o < 3; o++) {
    const char *w[] = {"ncclRedOpDestroy", "bitwise", NULL};
    EXPECT_REFUSED(comm, ncclRedOpDestroy(ops[o], comm), ncclInvalidArgument, w);
  }
  /* The communicator still works, with the bitwise operators too (one
   * rank: its own input, copied). */
  RCHECK(comm, ncclAllReduce(in, out, 3, ncclUint64, loomBxor, comm, NULL));
  RASSERT(out[0] == 0x0f && out[1] == 0xf0 && out[2] == 3, "one rank's XOR is %llx %llx %llx",
          (unsigned long long)out[0], (unsigned long long)out[1], (unsigned long long)out[2]);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

TEST_IMPL(redop_bitwise_refused) {
  setenv("LOOM_DEVICE", "host", 1);
  return run_ranks(1, refused_rank, NULL);
}

/* On a CUDA communicator (the emulated build's, or a GPU machine's) the
 * operators are refused with a sentence; a host-only machine skips. */
static int cuda_rank(int rank, int n, ncclUniqueId id, void *arg) {
  (void)arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int is_host = 1;
  RCHECK(comm, loomCommIsHost(comm, &is_host));
  if (is_host) {
    RCHECK(comm, ncclCommDestroy(comm));
    return TEST_SKIP;
  }
  void *buf = tbuf_alloc(comm, 64);
  RASSERT(buf, "no device buffer");
  for (int coll = 0; coll < C_COUNT; coll++)
    for (int o = 0; o < 3; o++) {
      const char *w[] = {"not implemented in Loom on CUDA communicators", NULL};
      EXPECT_REFUSED(comm, call(coll, buf, buf, 4, ncclInt32, ops[o], 0, comm), ncclInvalidArgument, w);
    }
  RCHECK(comm, ncclCommDestroy(comm));
  tbuf_free(buf);
  return 0;
}

TEST_IMPL(redop_bitwise_cuda_refused) {
  if (harness_cuda_devices() == 0)
    SKIP("no CUDA device (real or emulated): the host communicators have the bitwise operators");
  return run_ranks(1, cuda_rank, NULL);
}

/* ---- ranks that disagree on the operator ---- */

struct mism {
  ncclRedOp_t op[3];
  const char *want[4];
};

static int mism_rank(int rank, int n, ncclUniqueId id, void *arg) {
  const struct mism *m = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int32_t buf[100] = {0}, out[100];
  ncclResult_t r = ncclAllReduce(buf, out, 100, ncclInt32, m->op[rank], comm, NULL);
  const char *msg = ncclGetLastError(comm);
  RASSERT(r == ncclInvalidUsage, "rank %d: the mismatched call returned %d (%s): %s", rank, (int)r,
          ncclGetErrorString(r), msg);
  for (const char *const *kw = m->want; *kw; kw++)
    RASSERT(strstr(msg, *kw), "rank %d: the error does not mention \"%s\": %s", rank, *kw, msg);
  RCHECK(NULL, ncclCommDestroy(comm));
  return 0;
}

/* The cross-rank call check (LOOM_CHECK_CALLS) names every rank's call. */
TEST_IMPL(redop_bitwise_call_check) {
  static const struct mism m = {
      {loomBand, loomBor, loomBand},
      {"differ in the reduction op", "ranks 0, 2 called AllReduce(count 100, int32, band)",
       "rank 1 called AllReduce(count 100, int32, bor)", NULL}};
  setenv("LOOM_DEVICE", "host", 1);
  setenv("LOOM_CHECK_CALLS", "1", 1);
  setenv("LOOM_TIMEOUT", "15", 1);
  return run_ranks(3, mism_rank, (void *)&m);
}

/* Without it, the first slot's header still tells XOR from Sum. */
TEST_IMPL(redop_bitwise_mismatch_slot) {
  static const struct mism m = {{loomBxor, ncclSum, loomBxor},
                                {"AllReduce(count 100, int32, bxor)", "AllReduce(count 100, int32, sum)", NULL}};
  setenv("LOOM_DEVICE", "host", 1);
  setenv("LOOM_CHECK_CALLS", "0", 1);
  setenv("LOOM_TIMEOUT", "15", 1);
  return run_ranks(2, mism_rank, (void *)&m);
}
