/*
 * Every collective x datatype x op x count x placement, on 2, 3, 4 and 8
 * ranks, over shm and over sockets, against a reference computed here.
 *
 * Inputs are x(r, i) = A(i) + B(r) (Prod: A'(i) * C(r)) with small integers
 * chosen per type so that every partial result any reduction order can
 * produce is exactly representable: Sum, Prod, Max and Min must then be
 * exact for every type, fp8 included. Avg and PreMulSum multiply by
 * scalars and are held to the forward error bound of the summation,
 * (n + 1) * u * sum|terms|, with u the type's unit roundoff.
 *
 * The "about 1M+3" count is the call's count for AllReduce, Reduce and
 * Broadcast, and the total over ranks for AllGather and ReduceScatter.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#if LOOM_TEST_CUDA
#include "misc/gpurt.h"
#endif
#include "coll_matrix.h"
#include "harness.h"
#include "loom.h"
#include "nccl.h"
#include "test.h"

enum { C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_COUNT };
static const char *cname[] = {"AllReduce", "Reduce", "ReduceScatter", "AllGather", "Broadcast"};
enum { OP_PREMUL = 5 };
static const char *opname[] = {"sum", "prod", "max", "min", "avg", "premulsum"};

#define LARGE (1048576 + 3)

static uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (uint32_t)x;
}

static int is_unsigned(int t) { return t == ncclUint8 || t == ncclUint32 || t == ncclUint64; }
static int is_int(int t) { return !dtype_is_float(t); }

/* A(i) and B(r) bounds per type: see the comment at the top. */
static void bounds(int t, int *amax, int *bmode) {
  if (t == ncclFloat8e4m3) {
    *amax = 1;
    *bmode = 1; /* B in {-1, 0, 1} */
  } else if (t == ncclFloat8e5m2) {
    *amax = 1;
    *bmode = 0; /* B = 0 */
  } else {
    *amax = 2;
    *bmode = 2; /* B = r - 4: distinct per rank */
  }
}

/* How many values A(i) (Aprod(i) for Prod) takes for the type. */
static unsigned span_of(int t, int op) {
  int amax, bm;
  bounds(t, &amax, &bm);
  return op == ncclProd ? 4 : (unsigned)(2 * amax + 1);
}

/* Which of those values element i has in the call with `seed`. */
static unsigned draw(uint64_t seed, size_t i, unsigned span) {
  return (unsigned)(((uint64_t)mix(seed * 0x9e3779b97f4a7c15ull + i) * span) >> 32);
}

/* Value k of A (Aprod for Prod). */
static double a_value(int t, int op, unsigned k) {
  static const double f[] = {1, -1, 2, 0.5}, s[] = {1, -1, 2, 3}, u[] = {1, 2, 3, 1};
  if (op == ncclProd)
    return is_unsigned(t) ? u[k] : is_int(t) ? s[k] : f[k];
  int amax, bm;
  bounds(t, &amax, &bm);
  return is_unsigned(t) ? (double)k : (double)((int)k - amax);
}

static double B(int t, int r) {
  int amax, bm;
  bounds(t, &amax, &bm);
  if (is_unsigned(t))
    return (double)r;
  return bm == 2 ? (double)(r - 4) : bm == 1 ? (double)(r % 3 - 1) : 0.0;
}

static double Cprod(int t, int r) { return is_unsigned(t) ? (double)(1 + r % 2) : (r % 3 == 1 ? -1.0 : 1.0); }

/* PreMulSum scalars: powers of two for floats, small integers for ints. */
static double premul_scalar(int t, int r) {
  static const double f[] = {1, 0.5, 2};
  return is_int(t) ? (double)(1 + r % 3) : f[r % 3];
}

/* Rank r's input built on value k of A (Aprod). */
static double input_of(int t, int op, int r, unsigned k) {
  return op == ncclProd ? a_value(t, op, k) * Cprod(t, r) : a_value(t, op, k) + B(t, r);
}

static double unit_roundoff(int t) {
  switch (t) {
  case ncclFloat16: return ldexp(1, -11);
  case ncclBfloat16: return ldexp(1, -8);
  case ncclFloat32: return ldexp(1, -24);
  case ncclFloat64: return ldexp(1, -53);
  case ncclFloat8e4m3: return ldexp(1, -4);
  case ncclFloat8e5m2: return ldexp(1, -3);
  default: return 0;
  }
}

/* Wraps an exact integer result the way the type does. */
static double wrap_int(int t, double v) {
  char tmp[8];
  dtype_store(t, tmp, 0, v);
  return dtype_load(t, tmp, 0);
}

/* The reduced value of an element whose inputs are built on `a` (A(i),
 * or Aprod(i) for Prod). */
static void reference_of(int t, int op, int n, double a, double avg_scalar, double *want, double *tol) {
  *tol = 0;
  if (op == ncclProd) {
    double p = 1;
    for (int r = 0; r < n; r++)
      p *= a * Cprod(t, r);
    *want = is_int(t) ? wrap_int(t, p) : p;
    return;
  }
  double sum = 0, mx = -1e300, mn = 1e300, pre = 0, mag = 0, plain = 0;
  for (int r = 0; r < n; r++) {
    double x = a + B(t, r);
    sum += x;
    mx = x > mx ? x : mx;
    mn = x < mn ? x : mn;
    pre += x * premul_scalar(t, r);
    mag += fabs(x * premul_scalar(t, r));
    plain += fabs(x);
  }
  switch (op) {
  case ncclSum: *want = is_int(t) ? wrap_int(t, sum) : sum; break;
  case ncclMax: *want = mx; break;
  case ncclMin: *want = mn; break;
  case ncclAvg:
    if (is_int(t)) {
      /* Sum wrapped to the type, then C division. */
      double w = wrap_int(t, sum);
      *want = is_unsigned(t) ? floor(w / n) : trunc(w / n);
    } else {
      *want = sum * avg_scalar;
      *tol = (n + 1) * unit_roundoff(t) * avg_scalar * plain;
    }
    break;
  default:
    *want = is_int(t) ? wrap_int(t, pre) : pre;
    *tol = is_int(t) ? 0 : (n + 1) * unit_roundoff(t) * mag;
  }
}

/* An element's value depends on the rank and on which of A's few values
 * (span_of) it drew, so a call's inputs and results are tables of that
 * many entries, each stored in the type once: filling and checking a large
 * buffer then costs a hash and a copy or comparison per element, instead
 * of conversions and a reduction over the ranks (which made the matrix at
 * 8 ranks minutes long). */
struct values {
  int t;
  unsigned span;
  double v[8], tol[8];
  unsigned char bytes[8][8]; /* v[k] stored in the type */
};

/* Rank r's inputs. */
static void values_input(struct values *x, int t, int op, int r) {
  x->t = t;
  x->span = span_of(t, op);
  for (unsigned k = 0; k < x->span; k++) {
    x->v[k] = input_of(t, op, r, k);
    x->tol[k] = 0;
    dtype_store(t, x->bytes[k], 0, x->v[k]);
  }
}

/* The reduction of the n ranks' inputs. */
static void values_reduced(struct values *x, int t, int op, int n, double avg_scalar) {
  x->t = t;
  x->span = span_of(t, op);
  for (unsigned k = 0; k < x->span; k++) {
    reference_of(t, op, n, a_value(t, op, k), avg_scalar, &x->v[k], &x->tol[k]);
    dtype_store(t, x->bytes[k], 0, x->v[k]);
  }
}

static void fill(const struct values *x, uint64_t seed, char *buf, size_t first, size_t n) {
  size_t es = dtype_size(x->t);
  for (size_t i = 0; i < n; i++)
    memcpy(buf + i * es, x->bytes[draw(seed, first + i, x->span)], es);
}

/* The first of n elements of buf (element `first` onwards of the call's
 * draws) that is not as expected, or -1; *want and *tol are its. */
static long check(const struct values *x, uint64_t seed, const char *buf, size_t first, size_t n, double *want,
                  double *tol) {
  size_t es = dtype_size(x->t);
  for (size_t i = 0; i < n; i++) {
    unsigned k = draw(seed, first + i, x->span);
    if (memcmp(buf + i * es, x->bytes[k], es) == 0)
      continue;
    /* Another encoding may still be right (-0, or within a tolerance). */
    if (fabs(dtype_load(x->t, buf, i) - x->v[k]) <= x->tol[k])
      continue;
    *want = x->v[k];
    *tol = x->tol[k];
    return (long)i;
  }
  return -1;
}

struct cfg {
  int socket;
};

#define LOOM_MAX_OFF(a, b) ((a) > (b) ? (a) : (b))

static int nops_for(int coll) { return coll <= C_REDUCESCATTER ? 6 : 1; }

/* Where a CUDA communicator's calls run: a device twin of the host pool
 * (data is prepared and checked on the host) and a stream. */
struct gpu {
  char *pool;
  void *stream;
};

static ncclResult_t call(int coll, const void *s, void *r, size_t count, int t, ncclRedOp_t op, int root,
                         ncclComm_t comm, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  switch (coll) {
  case C_ALLREDUCE: return ncclAllReduce(s, r, count, t, op, comm, st);
  case C_REDUCE: return ncclReduce(s, r, count, t, op, root, comm, st);
  case C_REDUCESCATTER: return ncclReduceScatter(s, r, count, t, op, comm, st);
  case C_ALLGATHER: return ncclAllGather(s, r, count, t, comm, st);
  default: return ncclBroadcast(s, r, count, t, root, comm, st);
  }
}

/* Runs the call on the host pool, or on its device twin: the bytes the call
 * touches go over before and come back after. */
static int call_on(const struct gpu *g, int coll, char *pool, size_t used, const char *sendbuf, char *recvbuf,
                   size_t count, int t, ncclRedOp_t op, int root, ncclComm_t comm) {
  if (!g) {
    RCHECK(comm, call(coll, sendbuf, recvbuf, count, t, op, root, comm, NULL));
    return 0;
  }
#if LOOM_TEST_CUDA
  RASSERT(cudaMemcpy(g->pool, pool, used, cudaMemcpyHostToDevice) == cudaSuccess, "copy to the GPU");
  RCHECK(comm, call(coll, g->pool + (sendbuf - pool), g->pool + (recvbuf - pool), count, t, op, root, comm, g->stream));
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)g->stream);
  RASSERT(e == cudaSuccess, "cudaStreamSynchronize: %s", cudaGetErrorString(e));
  ncclResult_t async = ncclSuccess;
  RCHECK(comm, ncclCommGetAsyncError(comm, &async));
  RASSERT(async == ncclSuccess, "asynchronous error: %s", ncclGetLastError(comm));
  RASSERT(cudaMemcpy(pool, g->pool, used, cudaMemcpyDeviceToHost) == cudaSuccess, "copy from the GPU");
  return 0;
#else
  return 1;
#endif
}

/* One call and its check. Out-of-place buffers are deliberately
 * misaligned; in-place ones sit where NCCL's in-place rules put them. */
static int run_one(ncclComm_t comm, const struct gpu *g, int rank, int n, int coll, int t, int opi, size_t count,
                   int inplace, char *pool, size_t pool_bytes) {
  size_t es = dtype_size(t);
  size_t send_n = coll == C_REDUCESCATTER ? count * n : count;
  size_t recv_n = coll == C_ALLGATHER ? count * n : count;
  uint64_t seed = ((uint64_t)coll << 40) ^ ((uint64_t)t << 32) ^ ((uint64_t)opi << 24) ^ count ^ ((uint64_t)inplace << 20);
  int root = (int)(count % (size_t)n);
  char *sendbuf, *recvbuf;
  if (inplace) {
    /* ReduceScatter's two in-place forms take turns: NCCL's (the result
     * at this rank's block) for odd counts, MPI's (at the start) for even. */
    recvbuf = pool;
    sendbuf = coll == C_ALLGATHER ? recvbuf + (size_t)rank * count * es : recvbuf;
    if (coll == C_REDUCESCATTER && count % 2 == 1)
      recvbuf = sendbuf + (size_t)rank * count * es;
  } else {
    sendbuf = pool + 1 + (size_t)(rank % 3);
    recvbuf = pool + ((send_n * es + 64 + 63) & ~(size_t)63) + 3;
  }
  if ((size_t)(recvbuf - pool) + recv_n * es + 8 > pool_bytes || send_n * es + 8 > pool_bytes)
    return 0;
  /* Fill the input; the Prod inputs and the others differ. */
  int op = opi == OP_PREMUL ? -1 : opi;
  int gen_op = coll <= C_REDUCESCATTER ? op : ncclSum;
  struct values mine;
  values_input(&mine, t, gen_op, rank);
  fill(&mine, seed, sendbuf, 0, send_n);
  if (!inplace)
    memset(recvbuf, 0xa5, recv_n * es);
  ncclRedOp_t rop = (ncclRedOp_t)(op < 0 ? ncclSum : op);
  char scalar[8];
  if (opi == OP_PREMUL) {
    dtype_store(t, scalar, 0, premul_scalar(t, rank));
    RCHECK(comm, ncclRedOpCreatePreMulSum(&rop, scalar, t, ncclScalarHostImmediate, comm));
  }
  size_t used = LOOM_MAX_OFF(sendbuf + send_n * es, recvbuf + recv_n * es) - pool;
  if (call_on(g, coll, pool, used, sendbuf, recvbuf, count, t, rop, root, comm))
    return 1;
  if (opi == OP_PREMUL)
    RCHECK(comm, ncclRedOpDestroy(rop, comm));
  double avg_scalar = 0;
  if (op == ncclAvg && !is_int(t)) {
    char tmp[8];
    dtype_store(t, tmp, 0, 1.0 / n);
    avg_scalar = dtype_load(t, tmp, 0);
  }
  if (coll == C_REDUCE && rank != root)
    return 0;
  /* The expected values: per block of the source rank for AllGather,
   * the root's for Broadcast, the reduction's for the others. */
  struct values want;
  size_t block = coll == C_ALLGATHER ? count : recv_n, first = coll == C_REDUCESCATTER ? (size_t)rank * count : 0;
  for (size_t b = 0; b * block < recv_n; b++) {
    if (coll == C_ALLGATHER)
      values_input(&want, t, ncclSum, (int)b);
    else if (coll == C_BROADCAST)
      values_input(&want, t, ncclSum, root);
    else
      values_reduced(&want, t, op, n, avg_scalar);
    double w = 0, tol = 0;
    long bad = check(&want, seed, recvbuf + b * block * es, coll == C_ALLGATHER ? 0 : first, block, &w, &tol);
    if (bad >= 0) {
      size_t i = b * block + (size_t)bad;
      fprintf(stderr,
              "rank %d of %d: %s %s %s count %zu %s root %d: element %zu is %.9g, expected %.9g (tolerance %g)\n",
              rank, n, cname[coll], dtype_name(t), coll <= C_REDUCESCATTER ? opname[opi] : "-", count,
              inplace ? "in-place" : "out-of-place", root, i, dtype_load(t, recvbuf, i), w, tol);
      return 1;
    }
  }
  return 0;
}

int coll_matrix(ncclComm_t comm, int rank, int n, int *ncalls) {
  static const size_t small[] = {0, 1, 7, 4097};
  size_t pool_bytes = (size_t)(LARGE + 64) * 8 * 2 + 4096;
  char *pool = malloc(pool_bytes);
  RASSERT(pool != NULL, "out of memory");
  size_t large = LARGE;
  int is_host = 1;
  RCHECK(comm, loomCommIsHost(comm, &is_host));
  struct gpu *g = NULL;
  if (!is_host) {
#if LOOM_TEST_CUDA
    static struct gpu gpu_ctx;
    /* GPU ranks often share one device by time slices; the large count
     * shrinks to keep the matrix within the device check's minutes. */
    large = getenv("LOOM_TEST_LARGE") ? (size_t)atol(getenv("LOOM_TEST_LARGE")) : 65539;
    cudaStream_t st;
    RASSERT(cudaMalloc((void **)&gpu_ctx.pool, pool_bytes) == cudaSuccess, "cudaMalloc of the pool");
    RASSERT(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreate");
    gpu_ctx.stream = st;
    g = &gpu_ctx;
#else
    RASSERT(0, "a CUDA communicator, but this test was built without CUDA");
#endif
  }
  int calls = 0;
  /* LOOM_TEST_ALLREDUCE_ONLY: the tests that force an AllReduce algorithm
   * run just that part of the matrix. */
  int ncolls = getenv("LOOM_TEST_ALLREDUCE_ONLY") ? 1 : C_COUNT;
  for (int coll = 0; coll < ncolls; coll++)
    for (int t = 0; t < ncclNumTypes; t++)
      for (int opi = 0; opi < nops_for(coll); opi++)
        for (int k = 0; k < 5; k++) {
          size_t count = k < 4 ? small[k]
                         : (coll == C_ALLGATHER || coll == C_REDUCESCATTER) ? (size_t)((large / n) | 1)
                                                                            : large;
          for (int inplace = 0; inplace < 2; inplace++) {
            if (run_one(comm, g, rank, n, coll, t, opi, count, inplace, pool, pool_bytes)) {
              free(pool);
              return 1;
            }
            calls++;
          }
        }
  free(pool);
#if LOOM_TEST_CUDA
  if (g) {
    cudaFree(g->pool);
    cudaStreamDestroy((cudaStream_t)g->stream);
  }
#endif
  *ncalls = calls;
  return 0;
}

int coll_matrix_rank(int rank, int n, ncclUniqueId id, const char *transport, int *ncalls) {
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  if (coll_matrix(comm, rank, n, ncalls))
    return 1;
  const char *tr;
  RCHECK(comm, loomCommPeerTransport(comm, (rank + 1) % n, &tr));
  RASSERT(strcmp(tr, transport) == 0, "rank %d reaches rank %d over %s, expected %s", rank, (rank + 1) % n, tr,
          transport);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int coll_rank(int rank, int n, ncclUniqueId id, void *arg) {
  struct cfg *cfg = arg;
  ncclComm_t comm;
  RCHECK(NULL, ncclCommInitRank(&comm, n, id, rank));
  int calls = 0;
  if (coll_matrix(comm, rank, n, &calls))
    return 1;
  const char *tr = NULL;
  if (n > 1) {
    /* Whichever peers the algorithms connected, all over the expected
     * transport. */
    const char *expect = cfg->socket ? "net/socket" : "shm";
    int connected = 0;
    for (int q = 0; q < n; q++) {
      const char *t = NULL;
      if (q == rank)
        continue;
      RCHECK(comm, loomCommPeerTransport(comm, q, &t));
      if (strcmp(t, "none") == 0)
        continue;
      connected++;
      tr = t;
      RASSERT(strcmp(t, expect) == 0, "rank %d reached rank %d over %s, expected %s", rank, q, t, expect);
    }
    RASSERT(connected > 0, "rank %d connected to no peer", rank);
  }
  int nch = 0;
  RCHECK(comm, loomCommChannels(comm, &nch));
  const char *want = getenv("NCCL_MIN_NCHANNELS");
  int is_host = 1;
  RCHECK(comm, loomCommIsHost(comm, &is_host));
  /* A CUDA communicator (the emulated build's) chooses its own default. */
  RASSERT(want ? nch == atoi(want) : !is_host || nch >= 1, "rank %d has %d channels (NCCL_MIN_NCHANNELS=%s)", rank,
          nch, want ? want : "unset");
  RASSERT(want || !is_host || nch == 1, "host rank %d has %d channels by default", rank, nch);
  if (rank == 0)
    printf("%d ranks over %s, %d channel(s): %d calls checked\n", n, tr ? tr : "self", nch, calls);
  RCHECK(comm, ncclCommDestroy(comm));
  return 0;
}

static int coll_test(int n, int socket) {
  struct cfg cfg = {.socket = socket};
  if (socket) {
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  return run_ranks(n, coll_rank, &cfg);
}

TEST_IMPL(coll_shm_1) { return coll_test(1, 0); }
TEST_IMPL(coll_shm_2) { return coll_test(2, 0); }
TEST_IMPL(coll_shm_3) { return coll_test(3, 0); }
TEST_IMPL(coll_shm_4) { return coll_test(4, 0); }
TEST_IMPL(coll_shm_8) { return coll_test(8, 0); }
TEST_IMPL(coll_socket_2) { return coll_test(2, 1); }
TEST_IMPL(coll_socket_3) { return coll_test(3, 1); }
TEST_IMPL(coll_socket_4) { return coll_test(4, 1); }
TEST_IMPL(coll_socket_8) { return coll_test(8, 1); }
/* Each slot as header and payload apart, the framing of GPUDirect RDMA
 * connections: only rank 0 asks for it, and its peers follow on the
 * connections they share with it. */
static int split_on_rank0(int rank, void *arg) {
  if (rank == 0)
    setenv("LOOM_NET_SPLIT_SLOTS", "1", 1);
  return 0;
}

TEST_IMPL(coll_socket_split_3) {
  harness_set_rank_setup(split_on_rank0);
  return coll_test(3, 1);
}

/* AllReduce with each algorithm forced (recursive doubling only where the
 * buffer fits a FIFO, rings above). */
static int algo_test(int n, int socket, const char *algo) {
  setenv("NCCL_ALGO", algo, 1);
  setenv("LOOM_TEST_ALLREDUCE_ONLY", "1", 1);
  return coll_test(n, socket);
}

TEST_IMPL(coll_tree_shm_3) { return algo_test(3, 0, "allreduce:tree"); }
TEST_IMPL(coll_tree_shm_4) { return algo_test(4, 0, "allreduce:tree"); }
TEST_IMPL(coll_tree_shm_8) { return algo_test(8, 0, "allreduce:tree"); }
TEST_IMPL(coll_tree_socket_4) { return algo_test(4, 1, "allreduce:tree"); }
TEST_IMPL(coll_rd_shm_2) { return algo_test(2, 0, "allreduce:recursivedoubling,ring"); }
TEST_IMPL(coll_rd_shm_5) { return algo_test(5, 0, "allreduce:recursivedoubling,ring"); }
TEST_IMPL(coll_rd_shm_8) { return algo_test(8, 0, "allreduce:recursivedoubling,ring"); }
TEST_IMPL(coll_rd_socket_3) { return algo_test(3, 1, "allreduce:recursivedoubling,ring"); }
TEST_IMPL(coll_ring_only_shm_4) { return algo_test(4, 0, "ring"); }

/* Several channels: each call's buffer split over parallel rings (or,
 * for trees, over both trees of the double tree), sizes above a channel's
 * half megabyte using all of them. */
static int channels_test(int n, int socket, int nch, const char *algo) {
  char v[8];
  snprintf(v, sizeof v, "%d", nch);
  setenv("NCCL_MIN_NCHANNELS", v, 1);
  setenv("NCCL_MAX_NCHANNELS", v, 1);
  if (algo)
    return algo_test(n, socket, algo);
  return coll_test(n, socket);
}

TEST_IMPL(coll_channels_shm_3) { return channels_test(3, 0, 4, NULL); }
TEST_IMPL(coll_channels_socket_2) { return channels_test(2, 1, 2, NULL); }
TEST_IMPL(coll_channels_tree_shm_4) { return channels_test(4, 0, 2, "allreduce:tree"); }

/* Single copy: with a threshold of one byte every slot that forwards data
 * unchanged goes by reference (process_vm_readv between these processes),
 * and the matrix checks every result. */
static int single_copy_test(int n, const char *algo) {
  setenv("LOOM_SHM_SINGLE_COPY", "1", 1);
  if (algo)
    return algo_test(n, 0, algo);
  return coll_test(n, 0);
}

TEST_IMPL(coll_single_copy_shm_2) { return single_copy_test(2, NULL); }
TEST_IMPL(coll_single_copy_shm_4) { return single_copy_test(4, NULL); }
TEST_IMPL(coll_single_copy_tree_shm_4) { return single_copy_test(4, "allreduce:tree"); }

/* Ranks that never spin (the oversubscribed setting) still complete. */
TEST_IMPL(coll_no_spin_shm_3) {
  setenv("LOOM_SPIN_US", "0", 1);
  return coll_test(3, 0);
}
