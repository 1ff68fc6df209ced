/*
 * Inputs, expected outputs and checking for the benchmarks.
 *
 * Every rank's input is a function of (seed, rank, index), so any rank can
 * compute any other rank's input, and so the expected value of each of its
 * output elements, without communicating. The values are small integers
 * (in [-4, 4], [0, 8] for unsigned types) that every type holds exactly and
 * whose sums stay exact in float and double; they come from a hash rather
 * than a short arithmetic cycle so that data landing at the wrong offset
 * (a chunk shifted by a few elements) is caught. Prod uses 1, -1 (signed
 * and float types) and 2, with at most one 2 per eight ranks for each
 * element and none past rank 63, so float products stay at most 2^8, which
 * even E4M3 (max 448) holds exactly. Integer results are compared exactly,
 * with the type's wrap-around (NCCL's Avg divides the wrapped sum).
 *
 * Float Sum/Avg/MulSum results may differ from the exact value by rounding
 * in the library (partial sums are rounded to the type at each step of a
 * ring, fp8/fp16 may be accumulated in fp32). The tolerance is one unit in
 * the last place of the expected value plus tol(type) times the sum of the
 * magnitudes of the terms, times nranks for Avg and MulSum, whose scaling
 * adds a rounding per term. tol is 1e-5 (float), 1e-12 (double), 1e-2
 * (half), 3e-2 (bfloat16), 0.25 (e4m3), 0.5 (e5m2): loose against rounding,
 * tight against a lost or doubled contribution, which is off by at least 1.
 * Min, Max and Prod of these values are exact in every type and compared
 * exactly.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "common/dtype.h"

typedef enum { K_SINT, K_UINT, K_FLOAT } kind_t;

typedef struct {
  size_t size;
  kind_t kind;
  int mbits, emin; /* floats: mantissa bits and smallest normal exponent */
  double tol;
} tinfo_t;

static const tinfo_t TYPES[ncclNumTypes] = {
    [ncclInt8] = {1, K_SINT, 0, 0, 0},          [ncclUint8] = {1, K_UINT, 0, 0, 0},
    [ncclInt32] = {4, K_SINT, 0, 0, 0},         [ncclUint32] = {4, K_UINT, 0, 0, 0},
    [ncclInt64] = {8, K_SINT, 0, 0, 0},         [ncclUint64] = {8, K_UINT, 0, 0, 0},
    [ncclFloat16] = {2, K_FLOAT, 10, -14, 1e-2}, [ncclFloat32] = {4, K_FLOAT, 23, -126, 1e-5},
    [ncclFloat64] = {8, K_FLOAT, 52, -1022, 1e-12},
    [ncclBfloat16] = {2, K_FLOAT, 7, -126, 3e-2},
    [ncclFloat8e4m3] = {1, K_FLOAT, 3, -6, 0.25}, [ncclFloat8e5m2] = {1, K_FLOAT, 2, -14, 0.5},
};

size_t perf_type_size(ncclDataType_t type) { return TYPES[type].size; }

/* Untouched output reads as NaN in every float format (all-ones bytes) and
 * as a value no int input or copy produces. */
static unsigned char poison_byte(ncclDataType_t t) {
  return TYPES[t].kind == K_FLOAT ? 0xff : 0xa5;
}

/* ---- elements ------------------------------------------------------------ */

/* The library's own conversions (src/common/dtype.c), exhaustively tested by
 * its unit tests, so the benchmarks and the library agree on rounding. */
static void store_float(void *p, ncclDataType_t t, double v) { dtype_store(t, p, 0, v); }

static double load_float(const void *p, ncclDataType_t t) { return dtype_load(t, p, 0); }

/* Integers travel as uint64 in two's complement; stores truncate. */
static void store_int(void *p, size_t size, uint64_t v) {
  uint8_t u8 = (uint8_t)v;
  uint32_t u32 = (uint32_t)v;
  switch (size) {
    case 1: memcpy(p, &u8, 1); break;
    case 4: memcpy(p, &u32, 4); break;
    default: memcpy(p, &v, 8); break;
  }
}

/* Wraps v to the type's width, sign- or zero-extended back to 64 bits. */
static uint64_t wrap_int(uint64_t v, size_t size, int is_signed) {
  switch (size) {
    case 1: return is_signed ? (uint64_t)(int64_t)(int8_t)(uint8_t)v : (uint8_t)v;
    case 4: return is_signed ? (uint64_t)(int64_t)(int32_t)(uint32_t)v : (uint32_t)v;
    default: return v;
  }
}

static uint64_t load_int(const void *p, size_t size, int is_signed) {
  uint64_t v = 0;
  uint8_t u8;
  uint32_t u32;
  switch (size) {
    case 1: memcpy(&u8, p, 1); v = u8; break;
    case 4: memcpy(&u32, p, 4); v = u32; break;
    default: memcpy(&v, p, 8); break;
  }
  return wrap_int(v, size, is_signed);
}

static void store_value(void *p, ncclDataType_t t, int64_t v) {
  if (TYPES[t].kind == K_FLOAT) store_float(p, t, (double)v);
  else store_int(p, TYPES[t].size, (uint64_t)v);
}

/* ---- inputs -------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static inline int64_t input_value(uint64_t seed, int rank, size_t idx, perf_op op, int uns) {
  uint64_t h = mix64(seed + (uint64_t)rank * UINT64_C(0x9e3779b97f4a7c15) +
                     (uint64_t)idx * UINT64_C(0xd1b54a32d192ed03));
  if (op == PERF_OP_PROD) {
    if ((idx + (size_t)rank) % 8 == 0 && rank < 64) return 2;
    return (!uns && (h & 1)) ? -1 : 1;
  }
  int64_t v = (int64_t)(h % 9);
  return uns ? v : v - 4;
}

/* Powers of two for floats, so that scalar * input is exact in every type
 * and the check needs no knowledge of where the library rounds. */
static double mulsum_scalar_value(ncclDataType_t t, int rank) {
  if (TYPES[t].kind == K_FLOAT) return ldexp(1.0, -(rank % 3));
  return (double)(rank % 3 + 1);
}

void perf_mulsum_scalar(ncclDataType_t type, int rank, void *out) {
  memset(out, 0, 8);
  double s = mulsum_scalar_value(type, rank);
  if (TYPES[type].kind == K_FLOAT) store_float(out, type, s);
  else store_int(out, TYPES[type].size, (uint64_t)s);
}

/* ---- where the data lives ------------------------------------------------ */

static size_t es_of(const perf_check_ctx *x) { return TYPES[x->call->type].size; }

static char *input_ptr(const perf_check_ctx *x) {
  if (!x->in_place) return x->sendbuff;
  return x->recvbuff + x->counts->send_inplace_off * (size_t)x->call->rank * es_of(x);
}

static char *output_ptr(const perf_check_ctx *x) {
  if (!x->in_place) return x->recvbuff;
  return x->recvbuff + x->counts->recv_inplace_off * (size_t)x->call->rank * es_of(x);
}

/* Bytes from recvbuff to the end of everything the call may touch there. */
static size_t recv_extent(const perf_check_ctx *x) {
  size_t es = es_of(x);
  size_t end = (size_t)(output_ptr(x) - x->recvbuff) + x->counts->recvcount * es;
  if (x->in_place) {
    size_t in_end = (size_t)(input_ptr(x) - x->recvbuff) + x->counts->sendcount * es;
    if (in_end > end) end = in_end;
  }
  return end;
}

void perf_prepare(const perf_check_ctx *x) {
  ncclDataType_t t = x->call->type;
  size_t es = es_of(x);
  memset(x->recvbuff - x->guard, poison_byte(t), x->guard + recv_extent(x) + x->guard);
  char *in = input_ptr(x);
  int uns = TYPES[t].kind == K_UINT;
  for (size_t j = 0; j < x->counts->sendcount; j++)
    store_value(in + j * es, t, input_value(x->seed, x->call->rank, j, x->op, uns));
}

/* ---- expected values ----------------------------------------------------- */

typedef struct {
  uint64_t i;     /* ints: the exact result, wrapped and extended */
  double f;       /* floats: the exact result */
  double allowed; /* floats: the largest acceptable |got - f| */
} expect_t;

static double ulp_of(const tinfo_t *ti, double v) {
  int e = ti->emin;
  if (v != 0) {
    frexp(v, &e);
    e -= 1;
    if (e < ti->emin) e = ti->emin;
  }
  return ldexp(1.0, e - ti->mbits);
}

static void expect_reduce(const perf_check_ctx *x, size_t idx, expect_t *out) {
  ncclDataType_t t = x->call->type;
  const tinfo_t *ti = &TYPES[t];
  int n = x->call->nranks, uns = ti->kind == K_UINT;
  uint64_t seed = x->seed;
  perf_op op = x->op;
  if (ti->kind != K_FLOAT) {
    uint64_t acc = op == PERF_OP_PROD ? 1 : 0;
    int64_t best = 0;
    for (int k = 0; k < n; k++) {
      int64_t v = input_value(seed, k, idx, op, uns);
      switch (op) {
        case PERF_OP_PROD: acc *= (uint64_t)v; break;
        case PERF_OP_MAX: if (k == 0 || v > best) best = v; break;
        case PERF_OP_MIN: if (k == 0 || v < best) best = v; break;
        case PERF_OP_MULSUM: acc += (uint64_t)v * (uint64_t)mulsum_scalar_value(t, k); break;
        default: acc += (uint64_t)v; break;
      }
    }
    if (op == PERF_OP_MAX || op == PERF_OP_MIN) acc = (uint64_t)best;
    acc = wrap_int(acc, ti->size, !uns);
    if (op == PERF_OP_AVG)
      acc = uns ? acc / (uint64_t)n : (uint64_t)((int64_t)acc / (int64_t)n);
    out->i = wrap_int(acc, ti->size, !uns);
    return;
  }
  double e = op == PERF_OP_PROD ? 1 : 0, scale = 0;
  for (int k = 0; k < n; k++) {
    double v = (double)input_value(seed, k, idx, op, 0);
    switch (op) {
      case PERF_OP_PROD: e *= v; break;
      case PERF_OP_MAX: if (k == 0 || v > e) e = v; break;
      case PERF_OP_MIN: if (k == 0 || v < e) e = v; break;
      case PERF_OP_MULSUM: v *= mulsum_scalar_value(t, k); e += v; scale += fabs(v); break;
      default: e += v; scale += fabs(v); break;
    }
  }
  if (op == PERF_OP_AVG) {
    e /= n;
    scale /= n;
  }
  out->f = e;
  if (op == PERF_OP_PROD || op == PERF_OP_MAX || op == PERF_OP_MIN) {
    out->allowed = 0;
  } else {
    double per_term = (op == PERF_OP_AVG || op == PERF_OP_MULSUM) ? n : 1;
    out->allowed = ulp_of(ti, e) + ti->tol * scale * per_term;
  }
}

/* ---- checking ------------------------------------------------------------ */

static void format_elem(const void *p, ncclDataType_t t, char *buf, size_t len) {
  const tinfo_t *ti = &TYPES[t];
  if (ti->kind == K_FLOAT) snprintf(buf, len, "%.9g", load_float(p, t));
  else if (ti->kind == K_SINT) snprintf(buf, len, "%" PRId64, (int64_t)load_int(p, ti->size, 1));
  else snprintf(buf, len, "%" PRIu64, load_int(p, ti->size, 0));
}

__attribute__((format(printf, 4, 5))) static void report(int *left, int rank,
                                                       const char *label, const char *fmt, ...) {
  if (*left <= 0) return;
  (*left)--;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "# rank %d: %s: ", rank, label);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", *left == 0 ? " (further mismatches on this rank not shown)" : "");
}

/* Element-sized pieces of [p, p+len) that are not all poison. */
static int64_t count_poison_damage(const char *p, size_t len, size_t es, unsigned char pb,
                                   size_t *first) {
  int64_t bad = 0;
  for (size_t off = 0; off < len; off += es) {
    size_t n = len - off < es ? len - off : es;
    for (size_t b = 0; b < n; b++) {
      if ((unsigned char)p[off + b] != pb) {
        if (bad == 0) *first = off;
        bad++;
        break;
      }
    }
  }
  return bad;
}

int64_t perf_verify(const perf_check_ctx *x, const char *label, int *reports_left) {
  const perf_call *c = x->call;
  ncclDataType_t t = c->type;
  const tinfo_t *ti = &TYPES[t];
  size_t es = ti->size;
  int uns = ti->kind == K_UINT;
  unsigned char pb = poison_byte(t);
  const char *out = output_ptr(x);
  int64_t wrong = 0;
  char got[48], want[48];
  unsigned char cell[8];

  for (size_t j = 0; j < x->counts->recvcount; j++) {
    const char *p = out + j * es;
    perf_src src;
    x->bench->expect(c, x->in_place, j, &src);
    int ok;
    if (src.kind == PERF_SRC_POISON) {
      memset(cell, pb, es);
      ok = memcmp(p, cell, es) == 0;
      if (!ok) snprintf(want, sizeof(want), "untouched");
    } else if (src.kind == PERF_SRC_COPY) {
      /* Copies must be bit-exact. */
      store_value(cell, t, input_value(x->seed, src.rank, src.index, x->op, uns));
      ok = memcmp(p, cell, es) == 0;
      if (!ok) format_elem(cell, t, want, sizeof(want));
    } else {
      expect_t e = {0, 0, 0};
      expect_reduce(x, src.index, &e);
      if (ti->kind == K_FLOAT) {
        double g = load_float(p, t);
        ok = !isnan(g) && fabs(g - e.f) <= e.allowed;
        if (!ok) snprintf(want, sizeof(want), "%.9g (+-%.3g)", e.f, e.allowed);
      } else {
        ok = load_int(p, es, !uns) == e.i;
        if (!ok) snprintf(want, sizeof(want), uns ? "%" PRIu64 : "%" PRId64, e.i);
      }
    }
    if (!ok) {
      wrong++;
      format_elem(p, t, got, sizeof(got));
      report(reports_left, c->rank, label, "output element %zu is %s, expected %s", j, got, want);
    }
  }

  /* Nothing may be written around the data. */
  size_t first = 0;
  int64_t bad = count_poison_damage(x->recvbuff - x->guard, x->guard, es, pb, &first);
  if (bad)
    report(reports_left, c->rank, label, "%" PRId64 " element(s) before recvbuff were overwritten",
           bad);
  wrong += bad;
  size_t end = recv_extent(x);
  bad = count_poison_damage(x->recvbuff + end, x->guard, es, pb, &first);
  if (bad)
    report(reports_left, c->rank, label,
           "%" PRId64 " element(s) after the output were overwritten (from byte %zu past it)", bad,
           first);
  wrong += bad;

  /* An out-of-place input is const. */
  if (!x->in_place) {
    int64_t changed = 0;
    size_t firstj = 0;
    for (size_t j = 0; j < x->counts->sendcount; j++) {
      store_value(cell, t, input_value(x->seed, c->rank, j, x->op, uns));
      if (memcmp(x->sendbuff + j * es, cell, es) != 0 && changed++ == 0) firstj = j;
    }
    if (changed)
      report(reports_left, c->rank, label,
             "sendbuff was modified (first at element %zu, %" PRId64 " elements in all)", firstj,
             changed);
    wrong += changed;
  }
  return wrong;
}
