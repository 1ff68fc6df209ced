/*
 * The datatype conversions (src/common/dtype.c) and the reduction loops
 * (src/exec/reduce.c), against references written from the formats'
 * definitions with doubles and ldexp, not from the code under test.
 *
 * For tests/test_list.h (grep '^UNIT_TEST(' tests/unit_reduce.c):
UNIT_TEST(unit_dtype_basic, 30)
UNIT_TEST(unit_dtype_half, 30)
UNIT_TEST(unit_dtype_bf16, 30)
UNIT_TEST(unit_dtype_fp8, 30)
UNIT_TEST(unit_reduce_convert, 30)
UNIT_TEST(unit_reduce_all, 30)
UNIT_TEST(unit_reduce_copy, 30)
UNIT_TEST(unit_reduce_alias, 30)
UNIT_TEST(unit_reduce_once, 60)
 * SPDX-License-Identifier: Apache-2.0
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"
#include "common/fpconv.h"
#include "exec/reduce.h"
#include "test.h"

/* ---- Reference formats ---------------------------------------------------- */

/* A binary format by its definition: m mantissa bits, exponent bias, the
 * largest finite magnitude code, and how it treats overflow. */
struct fmt {
  const char *name;
  int m, bias;
  uint32_t maxcode, signbit;
  int sat;          /* SATFINITE: beyond the largest finite value is that value */
  uint32_t infcode; /* without sat: the code overflow rounds to */
  uint16_t (*enc16)(float);
  uint8_t (*enc8)(float);
  float (*dec)(uint32_t);
};

static float dec_half(uint32_t v) { return dtype_half_to_float((uint16_t)v); }
static float dec_bf16(uint32_t v) { return dtype_bf16_to_float((uint16_t)v); }
static float dec_e4m3(uint32_t v) { return dtype_e4m3_to_float((uint8_t)v); }
static float dec_e5m2(uint32_t v) { return dtype_e5m2_to_float((uint8_t)v); }

static const struct fmt F_HALF = {"half", 10, 15, 0x7BFF, 0x8000, 0, 0x7C00, dtype_float_to_half, NULL, dec_half};
static const struct fmt F_BF16 = {"bf16", 7, 127, 0x7F7F, 0x8000, 0, 0x7F80, dtype_float_to_bf16, NULL, dec_bf16};
static const struct fmt F_E4M3 = {"e4m3", 3, 7, 0x7E, 0x80, 1, 0, NULL, dtype_float_to_e4m3, dec_e4m3};
static const struct fmt F_E5M2 = {"e5m2", 2, 15, 0x7B, 0x80, 1, 0, NULL, dtype_float_to_e5m2, dec_e5m2};

static uint32_t encode(const struct fmt *f, float x) { return f->enc16 ? f->enc16(x) : f->enc8(x); }

/* The value of a finite positive magnitude code. */
static double ref_value(const struct fmt *f, uint32_t c) {
  uint32_t e = c >> f->m, mant = c & ((1u << f->m) - 1);
  if (e == 0)
    return ldexp(mant, 1 - f->bias - f->m);
  return ldexp(mant + (1u << f->m), (int)e - f->bias - f->m);
}

/* Round to nearest, ties to the even code, with the format's overflow. */
static uint32_t ref_encode(const struct fmt *f, double x) {
  uint32_t sign = signbit(x) ? f->signbit : 0;
  double a = fabs(x), maxv = ref_value(f, f->maxcode);
  if (a >= maxv) {
    if (f->sat)
      return sign | f->maxcode;
    double next = ldexp(1, (int)(f->maxcode >> f->m) - f->bias + 1);
    return sign | (a >= (maxv + next) / 2 ? f->infcode : f->maxcode);
  }
  uint32_t lo = 0, hi = f->maxcode; /* value(lo) <= a < value(hi) */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (ref_value(f, mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  double d1 = a - ref_value(f, lo), d2 = ref_value(f, hi) - a;
  if (d1 < d2)
    return sign | lo;
  if (d2 < d1)
    return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

/* Every float in a sweep of the bit patterns, against ref_encode. */
static void check_sweep(const struct fmt *f, uint32_t step) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += step) {
    float x = fpconv_float((uint32_t)u);
    uint32_t got = encode(f, x);
    if (isnan(x)) {
      ASSERT_MSG(isnan(f->dec(got)), "%s: NaN 0x%08x gave 0x%x", f->name, (unsigned)u, got);
      ASSERT((got & f->signbit) == (signbit(x) ? f->signbit : 0));
      continue;
    }
    uint32_t want = ref_encode(f, x);
    ASSERT_MSG(got == want, "%s: %a (0x%08x) gave 0x%x, want 0x%x", f->name, x, (unsigned)u, got, want);
  }
}

/* The midpoint of every pair of neighbouring codes and the floats either
 * side of it: ties go to the even code. */
static void check_midpoints(const struct fmt *f) {
  for (uint32_t c = 0; c <= f->maxcode; c++) {
    double lo = ref_value(f, c);
    double hi = c < f->maxcode ? ref_value(f, c + 1) : ldexp(1, (int)(f->maxcode >> f->m) - f->bias + 1);
    float mid = (float)((lo + hi) / 2);
    ASSERT((double)mid == (lo + hi) / 2);
    uint32_t up = c < f->maxcode ? c + 1 : (f->sat ? c : f->infcode);
    uint32_t even = (c & 1) ? up : c;
    for (int s = 0; s < 2; s++) {
      float sg = s ? -1.0f : 1.0f;
      uint32_t sb = s ? f->signbit : 0;
      ASSERT_MSG(encode(f, sg * mid) == (sb | even), "%s: tie above 0x%x gave 0x%x", f->name, c, encode(f, sg * mid));
      ASSERT(encode(f, sg * nextafterf(mid, INFINITY)) == (sb | up));
      ASSERT(encode(f, sg * nextafterf(mid, 0)) == (sb | c));
      ASSERT(encode(f, sg * (float)lo) == (sb | c));
    }
  }
}

/* ---- Datatype tests ------------------------------------------------------- */

TEST_IMPL(unit_dtype_basic) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  static const char *names[] = {"int8",   "uint8",  "int32",    "uint32", "int64",  "uint64",
                                "half",   "float",  "double",   "bfloat16", "f8e4m3", "f8e5m2"};
  for (int t = 0; t < ncclNumTypes; t++) {
    ASSERT(dtype_size(t) == sizes[t]);
    ASSERT(strcmp(dtype_name(t), names[t]) == 0);
    ASSERT(dtype_is_float(t) == (t >= ncclFloat16));
  }
  ASSERT(dtype_size(-1) == 0 && dtype_size(ncclNumTypes) == 0);
  ASSERT(strcmp(dtype_name(99), "unknown") == 0 && !dtype_is_float(-3));

  /* Integer stores truncate toward zero and wrap; unaligned is fine. */
  unsigned char buf[40];
  dtype_store(ncclInt8, buf + 1, 0, 200);
  ASSERT(dtype_load(ncclInt8, buf + 1, 0) == -56);
  dtype_store(ncclUint8, buf, 3, -1);
  ASSERT(buf[3] == 255);
  dtype_store(ncclInt32, buf + 3, 1, 4294967296.0 + 5);
  ASSERT(dtype_load(ncclInt32, buf + 3, 1) == 5);
  dtype_store(ncclInt32, buf + 1, 2, -3.7);
  ASSERT(dtype_load(ncclInt32, buf + 1, 2) == -3);
  dtype_store(ncclUint32, buf + 2, 0, -2);
  ASSERT(dtype_load(ncclUint32, buf + 2, 0) == 4294967294.0);
  uint64_t u;
  dtype_store(ncclUint64, buf + 5, 1, -1);
  memcpy(&u, buf + 5 + 8, 8);
  ASSERT(u == UINT64_MAX);
  dtype_store(ncclInt64, buf + 1, 0, 9223372036854775808.0);
  memcpy(&u, buf + 1, 8);
  ASSERT(u == (uint64_t)1 << 63);
  dtype_store(ncclUint64, buf, 0, ldexp(1, 70) + ldexp(1, 18));
  memcpy(&u, buf, 8);
  ASSERT(u == (uint64_t)1 << 18);
  dtype_store(ncclInt64, buf, 0, -ldexp(1, 64) - ldexp(1, 12));
  memcpy(&u, buf, 8);
  ASSERT(u == (uint64_t)0 - 4096);
  dtype_store(ncclInt64, buf, 0, -ldexp(1, 63) - ldexp(1, 11));
  memcpy(&u, buf, 8);
  ASSERT(u == ((uint64_t)1 << 63) - 2048);
  dtype_store(ncclInt32, buf, 0, NAN);
  ASSERT(dtype_load(ncclInt32, buf, 0) == 0);
  dtype_store(ncclInt64, buf + 7, 0, -123456789012.0);
  ASSERT(dtype_load(ncclInt64, buf + 7, 0) == -123456789012.0);

  /* Float stores round as the type. */
  dtype_store(ncclFloat32, buf + 1, 0, 1e40);
  ASSERT(isinf(dtype_load(ncclFloat32, buf + 1, 0)));
  dtype_store(ncclFloat64, buf + 3, 0, 0.1);
  ASSERT(dtype_load(ncclFloat64, buf + 3, 0) == 0.1);
  dtype_store(ncclFloat16, buf + 1, 1, 1e6);
  ASSERT(isinf(dtype_load(ncclFloat16, buf + 1, 1)));
  dtype_store(ncclFloat16, buf + 1, 1, 0.1);
  ASSERT(dtype_load(ncclFloat16, buf + 1, 1) == 0.0999755859375);
  dtype_store(ncclBfloat16, buf + 1, 0, 3.0);
  ASSERT(dtype_load(ncclBfloat16, buf + 1, 0) == 3.0);
  dtype_store(ncclFloat8e4m3, buf, 0, 1e6);
  ASSERT(dtype_load(ncclFloat8e4m3, buf, 0) == 448);
  dtype_store(ncclFloat8e5m2, buf, 0, -INFINITY);
  ASSERT(dtype_load(ncclFloat8e5m2, buf, 0) == -57344);
  dtype_store(ncclFloat8e5m2, buf, 0, NAN);
  ASSERT(isnan(dtype_load(ncclFloat8e5m2, buf, 0)));
  return 0;
}

TEST_IMPL(unit_dtype_half) {
  const struct fmt *f = &F_HALF;
  /* All 65536 values decode exactly and encode back to themselves. */
  for (uint32_t h = 0; h < 65536; h++) {
    float x = dtype_half_to_float((uint16_t)h);
    uint32_t e = (h >> 10) & 0x1F, mant = h & 0x3FF, sign = h & 0x8000;
    ASSERT((signbit(x) != 0) == (sign != 0));
    if (e == 31 && mant) {
      ASSERT(isnan(x));
      ASSERT(fpconv_bits(x) & 0x400000); /* quiet */
      ASSERT(dtype_float_to_half(x) == (h | 0x200)); /* quiet, payload kept */
      continue;
    }
    double want = e == 31 ? INFINITY : ref_value(f, h & 0x7FFF);
    ASSERT_MSG(fabs((double)x) == want, "half 0x%04x decoded to %a", h, x);
    ASSERT_MSG(dtype_float_to_half(x) == h, "half 0x%04x came back 0x%04x", h, dtype_float_to_half(x));
  }
  check_midpoints(f);
  check_sweep(f, 4093);
  /* The tricky ones by name. */
  ASSERT(dtype_float_to_half(65504.0f) == 0x7BFF);
  ASSERT(dtype_float_to_half(nextafterf(65520.0f, 0)) == 0x7BFF);
  ASSERT(dtype_float_to_half(65520.0f) == 0x7C00); /* the tie rounds to even: inf */
  ASSERT(dtype_float_to_half(1e10f) == 0x7C00 && dtype_float_to_half(-1e10f) == 0xFC00);
  ASSERT(dtype_float_to_half(INFINITY) == 0x7C00 && dtype_float_to_half(-INFINITY) == 0xFC00);
  ASSERT(dtype_float_to_half(0x1p-24f) == 0x0001);
  ASSERT(dtype_float_to_half(0x1p-25f) == 0x0000);                  /* tie to even */
  ASSERT(dtype_float_to_half(nextafterf(0x1p-25f, 1)) == 0x0001);
  ASSERT(dtype_float_to_half(0x3p-25f) == 0x0002);                  /* tie to even */
  ASSERT(dtype_float_to_half(0x1p-14f) == 0x0400);
  ASSERT(dtype_float_to_half(nextafterf(0x1p-14f, 0)) == 0x0400);   /* rounds up into the normals */
  ASSERT(dtype_float_to_half(0x1p-149f) == 0x0000 && dtype_float_to_half(-0x1p-149f) == 0x8000);
  ASSERT(dtype_float_to_half(1.0f) == 0x3C00);
  ASSERT(dtype_float_to_half(1.0f + 0x1p-11f) == 0x3C00);           /* tie to even */
  ASSERT(dtype_float_to_half(1.0f + 0x3p-11f) == 0x3C02);           /* tie to even */
  ASSERT(dtype_float_to_half(0.1f) == 0x2E66);
  ASSERT(dtype_float_to_half(-0.0f) == 0x8000);
  ASSERT(dtype_float_to_half(NAN) == 0x7E00 && dtype_float_to_half(-NAN) == 0xFE00);
  ASSERT(dtype_half_to_float(0x0001) == 0x1p-24f && dtype_half_to_float(0x03FF) == 0x3FFp-24f);
  ASSERT(dtype_half_to_float(0xC000) == -2.0f);
  return 0;
}

TEST_IMPL(unit_dtype_bf16) {
  const struct fmt *f = &F_BF16;
  for (uint32_t h = 0; h < 65536; h++) {
    float x = dtype_bf16_to_float((uint16_t)h);
    ASSERT(fpconv_bits(x) == h << 16); /* widening is exact, NaN payloads too */
    uint32_t e = (h >> 7) & 0xFF, mant = h & 0x7F;
    if (e == 255 && mant) {
      ASSERT(isnan(x));
      ASSERT(dtype_float_to_bf16(x) == (h | 0x40));
      continue;
    }
    if (e != 255)
      ASSERT(fabs((double)x) == ref_value(f, h & 0x7FFF));
    ASSERT(dtype_float_to_bf16(x) == h);
  }
  check_midpoints(f);
  check_sweep(f, 4093);
  ASSERT(dtype_float_to_bf16(1.0f + 0x1p-8f) == 0x3F80);  /* tie to even */
  ASSERT(dtype_float_to_bf16(1.0f + 0x3p-8f) == 0x3F82);  /* tie to even */
  ASSERT(dtype_float_to_bf16(0x1.FFp127f) == 0x7F80);     /* rounds past the largest: inf */
  ASSERT(dtype_float_to_bf16(0x1p-149f) == 0x0000);       /* far below bf16's 2^-133 */
  ASSERT(dtype_float_to_bf16(0x1p-134f) == 0x0000);       /* half a unit: tie to even */
  ASSERT(dtype_float_to_bf16(0x1p-133f) == 0x0001);
  ASSERT(dtype_float_to_bf16(0x3p-134f) == 0x0002);       /* 1.5 units: tie to even */
  ASSERT(dtype_float_to_bf16(-INFINITY) == 0xFF80);
  ASSERT(dtype_float_to_bf16(NAN) == 0x7FC0 && dtype_float_to_bf16(-NAN) == 0xFFC0);
  return 0;
}

static void check_fp8(const struct fmt *f, int e4m3) {
  for (uint32_t v = 0; v < 256; v++) {
    float x = f->dec(v);
    ASSERT((signbit(x) != 0) == ((v & 0x80) != 0));
    uint32_t mag = v & 0x7F;
    int nan = e4m3 ? mag == 0x7F : mag > 0x7C;
    if (nan) {
      ASSERT_MSG(isnan(x), "%s 0x%02x is NaN", f->name, v);
      uint32_t back = f->enc8(x);
      ASSERT(isnan(f->dec(back)) && (back & 0x80) == (v & 0x80));
      continue;
    }
    if (!e4m3 && mag == 0x7C) { /* e5m2 has infinities, which saturate */
      ASSERT(isinf(x));
      ASSERT(f->enc8(x) == ((v & 0x80) | 0x7B));
      continue;
    }
    ASSERT_MSG(fabs((double)x) == ref_value(f, mag), "%s 0x%02x decoded to %a", f->name, v, x);
    ASSERT(f->enc8(x) == v);
  }
  check_midpoints(f);
  check_sweep(f, 1021);
}

TEST_IMPL(unit_dtype_fp8) {
  check_fp8(&F_E4M3, 1);
  check_fp8(&F_E5M2, 0);
  ASSERT(dtype_e4m3_to_float(0x7E) == 448 && dtype_e4m3_to_float(0x01) == 0x1p-9f);
  ASSERT(dtype_e4m3_to_float(0x08) == 0x1p-6f && dtype_e4m3_to_float(0xBC) == -1.5f);
  ASSERT(dtype_float_to_e4m3(1e6f) == 0x7E && dtype_float_to_e4m3(-1e6f) == 0xFE);
  ASSERT(dtype_float_to_e4m3(464.0f) == 0x7E && dtype_float_to_e4m3(INFINITY) == 0x7E);
  ASSERT(dtype_float_to_e4m3(-INFINITY) == 0xFE);
  ASSERT(dtype_float_to_e4m3(NAN) == 0x7F && dtype_float_to_e4m3(-NAN) == 0xFF);
  ASSERT(dtype_float_to_e4m3(0x1p-10f) == 0x00 && dtype_float_to_e4m3(0x3p-10f) == 0x02);
  ASSERT(dtype_float_to_e4m3(1.0625f) == 0x38 && dtype_float_to_e4m3(1.1875f) == 0x3A);
  ASSERT(dtype_e5m2_to_float(0x7B) == 57344 && dtype_e5m2_to_float(0x01) == 0x1p-16f);
  ASSERT(isinf(dtype_e5m2_to_float(0x7C)) && isinf(dtype_e5m2_to_float(0xFC)));
  ASSERT(dtype_float_to_e5m2(INFINITY) == 0x7B && dtype_float_to_e5m2(-INFINITY) == 0xFB);
  ASSERT(dtype_float_to_e5m2(1e6f) == 0x7B && dtype_float_to_e5m2(61440.0f) == 0x7B);
  ASSERT(dtype_float_to_e5m2(NAN) == 0x7E && dtype_float_to_e5m2(-NAN) == 0xFE);
  ASSERT(dtype_float_to_e5m2(0x1p-17f) == 0x00 && dtype_float_to_e5m2(0x3p-17f) == 0x02);
  return 0;
}

/* ---- Reduction reference -------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint64_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Du;
}

static int is_signed(int t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

static uint64_t get_bits(int t, const void *p, size_t i) {
  uint64_t v = 0;
  memcpy(&v, (const char *)p + i * dtype_size(t), dtype_size(t)); /* little-endian */
  return v;
}

static void put_bits(int t, void *p, size_t i, uint64_t v) {
  memcpy((char *)p + i * dtype_size(t), &v, dtype_size(t));
}

static int64_t sext(int t, uint64_t v) {
  int sh = 64 - 8 * (int)dtype_size(t);
  return (int64_t)(v << sh) >> sh; /* gcc: arithmetic shift */
}

/* A value of type t at p[i]: random bits for integers and for half, bf16
 * and fp8 half the time (every code, NaN and inf included); otherwise
 * moderate numbers with the odd zero, infinity, NaN and subnormal. */
static void fill(int t, void *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rnd();
    if (!dtype_is_float(t) || ((t != ncclFloat32 && t != ncclFloat64) && (r & 1))) {
      put_bits(t, p, i, r >> 8);
      continue;
    }
    double v;
    switch ((r >> 1) & 31) {
    case 0: v = 0; break;
    case 1: v = -0.0; break;
    case 2: v = INFINITY; break;
    case 3: v = -NAN; break;
    case 4: v = ldexp((double)(r >> 40), -170); break;
    case 5: v = ldexp((double)(r >> 40), 100); break;
    default: v = ldexp((double)(int32_t)(r >> 32), -28 + (int)((r >> 8) & 7));
    }
    dtype_store(t, p, i, v);
  }
}

/* Rounded to the type t, for the premul-before-Prod/Max/Min path. */
static float round_to(int t, float v) {
  unsigned char tmp[8];
  dtype_store(t, tmp, 0, v);
  return (float)dtype_load(t, tmp, 0);
}

/* The element the header specifies, from a's and b's element i (no a:
 * red_copy's b'). */
static void ref_elem(const struct red_op *op, const void *a, const void *b, size_t i, int final, void *out) {
  int t = op->dtype;
  int div = final && op->postdiv && op->divisor > 1;
  if (!dtype_is_float(t)) {
    uint64_t ub = get_bits(t, b, i), r;
    if (op->premul)
      ub *= op->scalar.u;
    ub &= dtype_size(t) == 8 ? UINT64_MAX : (((uint64_t)1 << (8 * dtype_size(t))) - 1);
    if (!a) {
      r = ub;
    } else {
      uint64_t ua = get_bits(t, a, i);
      int64_t sa = sext(t, ua), sb = sext(t, ub);
      int sg = is_signed(t);
      switch (op->kind) {
      case RED_SUM: r = ua + ub; break;
      case RED_PROD: r = ua * ub; break;
      case RED_MAX: r = (sg ? sa > sb : ua > ub) ? ua : ub; break;
      case RED_BAND: r = ua & ub; break;
      case RED_BOR: r = ua | ub; break;
      case RED_BXOR: r = ua ^ ub; break;
      default: r = (sg ? sa < sb : ua < ub) ? ua : ub; break;
      }
    }
    if (div) {
      uint64_t m = dtype_size(t) == 8 ? UINT64_MAX : (((uint64_t)1 << (8 * dtype_size(t))) - 1);
      r = is_signed(t) ? (uint64_t)(sext(t, r & m) / op->divisor) : (r & m) / (uint64_t)op->divisor;
    }
    put_bits(t, out, 0, r);
    return;
  }
  if (!a && !op->premul) { /* a plain copy: the bits */
    put_bits(t, out, 0, get_bits(t, b, i));
    if (div)
      dtype_store(t, out, 0, dtype_load(t, out, 0) / op->divisor);
    return;
  }
  if (t == ncclFloat64) {
    double x = a ? dtype_load(t, a, i) : 0, y = dtype_load(t, b, i), r;
    if (op->premul)
      y = y * op->scalar.f;
    switch (a ? op->kind : -1) {
    case RED_SUM: r = x + y; break;
    case RED_PROD: r = x * y; break;
    case RED_MAX: r = x > y ? x : y; break;
    case RED_MIN: r = x < y ? x : y; break;
    default: r = y;
    }
    if (div)
      r = r / op->divisor;
    dtype_store(t, out, 0, r);
    return;
  }
  float x = a ? (float)dtype_load(t, a, i) : 0, y = (float)dtype_load(t, b, i), r;
  if (op->premul) {
    y = y * (float)op->scalar.f;
    if (a && op->kind != RED_SUM)
      y = round_to(t, y);
  }
  switch (a ? op->kind : -1) {
  case RED_SUM: r = x + y; break;
  case RED_PROD: r = x * y; break;
  case RED_MAX: r = x > y ? x : y; break;
  case RED_MIN: r = x < y ? x : y; break;
  default: r = y;
  }
  dtype_store(t, out, 0, r);
  if (div)
    dtype_store(t, out, 0, dtype_load(t, out, 0) / op->divisor);
}

static int same(int t, const void *x, const void *y) {
  if (dtype_is_float(t) && isnan(dtype_load(t, x, 0)) && isnan(dtype_load(t, y, 0)))
    return 1;
  return memcmp(x, y, dtype_size(t)) == 0;
}

static const char *kind_name(int k) {
  return (const char *[]){"sum", "prod", "max", "min", "band", "bor", "bxor"}[k];
}

/* got[0..n) against the reference, element by element. */
static void check_result(const struct red_op *op, const void *got, const void *a, const void *b, size_t n,
                         int final, const char *what) {
  size_t es = dtype_size(op->dtype);
  for (size_t i = 0; i < n; i++) {
    unsigned char want[8];
    ref_elem(op, a, b, i, final, want);
    if (!same(op->dtype, (const char *)got + i * es, want)) {
      uint64_t g = get_bits(op->dtype, got, i), w = get_bits(op->dtype, want, 0);
      uint64_t av = a ? get_bits(op->dtype, a, i) : 0, bv = get_bits(op->dtype, b, i);
      ASSERT_MSG(0, "%s %s %s premul=%d postdiv=%d final=%d n=%zu: element %zu of 0x%llx, 0x%llx is 0x%llx, want 0x%llx",
                 what, dtype_name(op->dtype), kind_name(op->kind), op->premul, op->postdiv, final, n, i,
                 (unsigned long long)av, (unsigned long long)bv, (unsigned long long)g, (unsigned long long)w);
    }
  }
}

/* The scalar of PreMulSum as the API stores it: in the type's own value. */
static void set_scalar(struct red_op *op, double f, int64_t i) {
  if (!dtype_is_float(op->dtype)) {
    op->scalar.i = i;
    return;
  }
  unsigned char tmp[8];
  dtype_store(op->dtype, tmp, 0, f);
  op->scalar.f = dtype_load(op->dtype, tmp, 0);
}

/* ---- Reduction tests ------------------------------------------------------ */

/* The kernels' own conversions, through operations that leave a value as it
 * is or double it: all 65536 half and bf16 values and all fp8 pairs. */
TEST_IMPL(unit_reduce_convert) {
  static const int types16[] = {ncclFloat16, ncclBfloat16};
  uint16_t *a = malloc(65536 * 2), *b = malloc(65536 * 2), *d = malloc(65536 * 2);
  ASSERT(a && b && d);
  for (int k = 0; k < 2; k++) {
    struct red_op op = {.dtype = types16[k], .kind = RED_MAX};
    for (uint32_t i = 0; i < 65536; i++)
      a[i] = (uint16_t)i;
    for (int kind = RED_SUM; kind <= RED_MIN; kind++) {
      op.kind = kind;
      for (int perm = 0; perm < 4; perm++) {
        for (uint32_t i = 0; i < 65536; i++)
          b[i] = perm == 0 ? (uint16_t)i : perm == 1 ? (uint16_t)(i ^ 0x8000) : (uint16_t)(i * (40503u + 2 * perm));
        red_reduce(&op, d, NULL, a, b, 65536, 0);
        check_result(&op, d, a, b, 65536, 0, "convert");
        /* Pieces of 7 run the portable tail code even where a vector path
         * (F16C) takes the rest. */
        for (uint32_t i = 0; i < 65536; i += 7)
          red_reduce(&op, d + i, NULL, a + i, b + i, 65536 - i < 7 ? 65536 - i : 7, 0);
        check_result(&op, d, a, b, 65536, 0, "convert, in pieces");
      }
    }
    /* Halving and scaling reach the subnormals from every binade. */
    op.kind = RED_SUM;
    op.premul = 1;
    for (int s = 0; s < 3; s++) {
      set_scalar(&op, s == 0 ? 0.5 : s == 1 ? 1.0 / 3 : 0x1p-12, 0);
      memset(b, 0, 65536 * 2);
      red_reduce(&op, d, NULL, b, a, 65536, 0);
      check_result(&op, d, b, a, 65536, 0, "convert premul");
      for (uint32_t i = 0; i < 65536; i += 7)
        red_copy(&op, d + i, NULL, a + i, 65536 - i < 7 ? 65536 - i : 7, 0);
      check_result(&op, d, NULL, a, 65536, 0, "convert premul copy, in pieces");
    }
  }
  free(a);
  free(b);
  free(d);

  static const int types8[] = {ncclFloat8e4m3, ncclFloat8e5m2};
  uint8_t *a8 = malloc(65536), *b8 = malloc(65536), *d8 = malloc(65536);
  ASSERT(a8 && b8 && d8);
  for (uint32_t i = 0; i < 65536; i++) {
    a8[i] = (uint8_t)i;
    b8[i] = (uint8_t)(i >> 8);
  }
  for (int k = 0; k < 2; k++) {
    for (int kind = RED_SUM; kind <= RED_MIN; kind++) {
      struct red_op op = {.dtype = types8[k], .kind = kind};
      red_reduce(&op, d8, NULL, a8, b8, 65536, 0);
      check_result(&op, d8, a8, b8, 65536, 0, "convert");
    }
  }
  free(a8);
  free(b8);
  free(d8);
  return 0;
}

#define GUARD 16

struct bufs {
  unsigned char *a, *b, *d, *d2, *a0, *b0;
};

static void *xmalloc(size_t n) {
  void *p = malloc(n);
  ASSERT(p != NULL);
  return p;
}

/* One red_reduce or red_copy call on fresh random buffers, at the given
 * misalignments, checked against the reference with guard bytes both sides. */
static void run_case(const struct red_op *op, size_t n, int final, int copy, int with_d2, const int off[3]) {
  size_t es = dtype_size(op->dtype), bytes = n * es, tot = bytes + 2 * GUARD + 8;
  unsigned char *ab = xmalloc(tot), *bb = xmalloc(tot), *db = xmalloc(tot), *d2b = xmalloc(tot);
  unsigned char *a = ab + GUARD + off[0], *b = bb + GUARD + off[1], *d = db + GUARD + off[2];
  unsigned char *d2 = d2b + GUARD + off[2] + 1;
  fill(op->dtype, a, n);
  fill(op->dtype, b, n);
  memset(db, 0xA5, tot);
  memset(d2b, 0x5A, tot);
  unsigned char *a0 = xmalloc(bytes + 1), *b0 = xmalloc(bytes + 1);
  memcpy(a0, a, bytes);
  memcpy(b0, b, bytes);
  if (copy)
    red_copy(op, d, with_d2 ? d2 : NULL, b, n, final);
  else
    red_reduce(op, d, with_d2 ? d2 : NULL, a, b, n, final);
  ASSERT(memcmp(a, a0, bytes) == 0 && memcmp(b, b0, bytes) == 0); /* inputs untouched */
  check_result(op, d, copy ? NULL : a, b, n, final, copy ? "copy" : "reduce");
  for (unsigned char *p = db; p < d; p++)
    ASSERT(*p == 0xA5);
  for (unsigned char *p = d + bytes; p < db + tot; p++)
    ASSERT(*p == 0xA5);
  if (with_d2) {
    ASSERT(memcmp(d, d2, bytes) == 0);
    for (unsigned char *p = d2 + bytes; p < d2b + tot; p++)
      ASSERT(*p == 0x5A);
  } else {
    for (unsigned char *p = d2b; p < d2b + tot; p++)
      ASSERT(*p == 0x5A);
  }
  free(ab);
  free(bb);
  free(db);
  free(d2b);
  free(a0);
  free(b0);
}

static const size_t sizes[] = {0, 1, 7, 33, 1023, 1024, 4097};
static const int offsets[][3] = {{0, 0, 0}, {1, 3, 2}, {6, 5, 7}};
#define COUNT(x) (sizeof(x) / sizeof((x)[0]))

/* mode 0: plain; 1: premul; 2: postdiv by 3; 3: postdiv by 1 (nothing). */
static void make_op(struct red_op *op, int t, int kind, int mode) {
  memset(op, 0, sizeof *op);
  op->dtype = t;
  op->kind = kind;
  if (mode == 1) {
    op->premul = 1;
    set_scalar(op, 1.0 / 3, is_signed(t) ? -3 : (int64_t)0x9E3779B97F4A7C15u);
  } else if (mode >= 2) {
    op->postdiv = 1;
    op->divisor = mode == 2 ? 3 : 1;
  }
}

TEST_IMPL(unit_reduce_all) {
  for (int t = 0; t < ncclNumTypes; t++)
    for (int kind = RED_SUM; kind <= RED_MIN; kind++)
      for (int mode = 0; mode < 4; mode++) {
        struct red_op op;
        make_op(&op, t, kind, mode);
        for (size_t si = 0; si < COUNT(sizes); si++)
          for (size_t oi = 0; oi < COUNT(offsets); oi++) {
            int final = (int)((si + oi) & 1) || mode < 2;
            run_case(&op, sizes[si], final, 0, (int)(oi & 1), offsets[oi]);
            if (mode >= 2)
              run_case(&op, sizes[si], !final, 0, (int)(~oi & 1), offsets[oi]);
          }
      }
  printf("reduction kernels: %s\n", red_isa());
  return 0;
}

TEST_IMPL(unit_reduce_copy) {
  for (int t = 0; t < ncclNumTypes; t++)
    for (int mode = 0; mode < 4; mode++) {
      struct red_op op;
      make_op(&op, t, RED_SUM, mode);
      for (size_t si = 0; si < COUNT(sizes); si++)
        for (size_t oi = 0; oi < COUNT(offsets); oi++)
          for (int final = 0; final < 2; final++)
            run_case(&op, sizes[si], final, 1, (int)((oi + final) & 1), offsets[oi]);
    }
  return 0;
}

/* dst may be a or b, and dst2 gets the same bytes; red_copy in place. */
TEST_IMPL(unit_reduce_alias) {
  static const int types[] = {ncclInt8, ncclInt32, ncclUint64, ncclFloat16, ncclFloat32,
                              ncclFloat64, ncclBfloat16, ncclFloat8e4m3};
  const size_t n = 5000;
  for (size_t ti = 0; ti < COUNT(types); ti++)
    for (int kind = RED_SUM; kind <= RED_MIN; kind++)
      for (int mode = 0; mode < 3; mode++)
        for (int which = 0; which < 3; which++) {
          int t = types[ti];
          size_t es = dtype_size(t), bytes = n * es;
          struct red_op op;
          make_op(&op, t, kind, mode);
          unsigned char *ab = xmalloc(bytes + 8), *bb = xmalloc(bytes + 8), *d2b = xmalloc(bytes + 8);
          unsigned char *a0 = xmalloc(bytes), *b0 = xmalloc(bytes);
          unsigned char *a = ab + 1, *b = bb + 3, *d2 = d2b + 2;
          fill(t, a, n);
          fill(t, b, n);
          memcpy(a0, a, bytes);
          memcpy(b0, b, bytes);
          if (which < 2) {
            red_reduce(&op, which == 0 ? a : b, d2, a, b, n, 1);
            check_result(&op, which == 0 ? a : b, a0, b0, n, 1, which == 0 ? "dst=a" : "dst=b");
            ASSERT(memcmp(which == 0 ? b : a, which == 0 ? b0 : a0, bytes) == 0);
          } else {
            red_copy(&op, b, d2, b, n, 1);
            check_result(&op, b, NULL, b0, n, 1, "copy in place");
          }
          ASSERT(memcmp(d2, which == 1 || which == 2 ? b : a, bytes) == 0);
          free(ab);
          free(bb);
          free(d2b);
          free(a0);
          free(b0);
        }
  return 0;
}

/* Loom's bitwise operators on the integer types (any alignment, dst2,
 * dst aliasing an input); on a float, which the API refuses, the kernel
 * writes nothing rather than something wrong. */
TEST_IMPL(unit_reduce_bitwise) {
  static const int ints[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64};
  for (size_t ti = 0; ti < COUNT(ints); ti++)
    for (int kind = RED_BAND; kind <= RED_BXOR; kind++) {
      struct red_op op;
      make_op(&op, ints[ti], kind, 0);
      for (size_t si = 0; si < COUNT(sizes); si++)
        for (size_t oi = 0; oi < COUNT(offsets); oi++) {
          run_case(&op, sizes[si], 1, 0, (int)(oi & 1), offsets[oi]);
          run_case(&op, sizes[si], 0, 1, (int)(~oi & 1), offsets[oi]);
        }
      const size_t n = 3001;
      size_t bytes = n * dtype_size(ints[ti]);
      unsigned char *a = xmalloc(bytes), *b = xmalloc(bytes), *a0 = xmalloc(bytes), *b0 = xmalloc(bytes);
      fill(ints[ti], a, n);
      fill(ints[ti], b, n);
      memcpy(a0, a, bytes);
      memcpy(b0, b, bytes);
      red_reduce(&op, b, NULL, a, b, n, 1);
      check_result(&op, b, a0, b0, n, 1, "dst=b");
      free(a);
      free(b);
      free(a0);
      free(b0);
    }
  for (int t = 0; t < ncclNumTypes; t++) {
    if (!dtype_is_float(t))
      continue;
    unsigned char a[64], b[64], d[64], d0[64];
    memset(a, 0x3c, sizeof a);
    memset(b, 0x41, sizeof b);
    memset(d, 0xA5, sizeof d);
    memcpy(d0, d, sizeof d);
    struct red_op op;
    make_op(&op, t, RED_BOR, 0);
    red_reduce(&op, d, NULL, a, b, 64 / dtype_size(t), 1);
    ASSERT(memcmp(d, d0, sizeof d) == 0);
  }
  return 0;
}

/* The kernel adds and multiplies fp16 and bf16 two at a time in their own
 * type (__hadd2_rn, __hmul2_rn: the exact result rounded once), where the
 * host and the rest of the kernel compute in fp32 and round that. The two
 * must agree on every input that is not NaN. They do because fp32 holds
 * enough bits (24 >= 2p + 2) that rounding first to fp32 never moves where
 * the value then rounds; a product is exact in fp32 unless it is far below
 * bf16's smallest subnormal, too far from the one midpoint there (2^-134)
 * to be rounded onto it. This checks every code against a spread of second
 * operands (every pair: 65536 in place of 251 as the stride; the bf16
 * product, the least obvious, was run so once: no mismatch). */
static uint32_t ref_once(const struct fmt *f, double exact) {
  uint32_t sign = signbit(exact) ? f->signbit : 0;
  if (isinf(exact))
    return sign | f->infcode;
  /* To the format's grid at this magnitude, ties to even (nearbyint in
   * the default rounding mode): quicker than ref_encode's search, and a
   * double holds these sums and products exactly, or (a bf16 sum of far
   * apart magnitudes) rounds them innocuously, 53 >= 2 x 8 + 2. */
  int e = ilogb(exact), emin = 1 - f->bias;
  int q = (e > emin ? e : emin) - f->m;
  double v = ldexp(nearbyint(ldexp(exact, -q)), q);
  if (fabs(v) > ref_value(f, f->maxcode))
    return sign | f->infcode;
  return sign | (uint32_t)f->enc16((float)fabs(v));
}

/* red_reduce (fp32, rounded) against ref_once over all codes a and the
 * codes b = 7 + k * stride. */
static void check_once(const struct fmt *f, int dtype, int kind, uint32_t stride) {
  const size_t n = 65536;
  uint16_t *a = xmalloc(n * 2), *b = xmalloc(n * 2), *d = xmalloc(n * 2);
  for (size_t i = 0; i < n; i++)
    a[i] = (uint16_t)i;
  struct red_op op;
  make_op(&op, dtype, kind, 0);
  for (uint32_t bc = 7; bc < 65536; bc += stride) {
    for (size_t i = 0; i < n; i++)
      b[i] = (uint16_t)bc;
    red_reduce(&op, d, NULL, a, b, n, 1);
    double y = f->dec(bc);
    for (size_t i = 0; i < n; i++) {
      double x = f->dec(a[i]);
      if (isnan(x) || isnan(y))
        continue;
      double exact = kind == RED_SUM ? x + y : x * y;
      if (isnan(exact)) {
        ASSERT(isnan(f->dec(d[i])));
        continue;
      }
      uint32_t want = ref_once(f, exact);
      ASSERT_MSG(d[i] == want, "%s %s: 0x%04zx, 0x%04x gave 0x%04x, rounded once 0x%04x", f->name,
                 kind == RED_SUM ? "sum" : "product", i, bc, d[i], want);
    }
  }
  free(a);
  free(b);
  free(d);
}

TEST_IMPL(unit_reduce_once) {
  check_once(&F_HALF, ncclFloat16, RED_SUM, 251);
  check_once(&F_HALF, ncclFloat16, RED_PROD, 251);
  check_once(&F_BF16, ncclBfloat16, RED_SUM, 251);
  check_once(&F_BF16, ncclBfloat16, RED_PROD, 251);
  return 0;
}
