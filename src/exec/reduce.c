/*
 * The reduction loops of the host executor: one loop per datatype and
 * operation, written so that gcc vectorises them, each compiled for
 * AVX-512, AVX2 and baseline x86-64 with the choice made at load time
 * (target_clones), never by -march=native. fp16 goes through F16C's
 * converters where the CPU has them (4x the portable loop's speed).
 *
 * Semantics the header leaves to this file:
 * - Integers wrap (the arithmetic is done on the unsigned type). Max and Min
 *   compare signed types as signed.
 * - Max and Min of floats are `a > b ? a : b` and `a < b ? a : b` with a the
 *   peer's partial result and b the local input: a NaN in b always wins, a
 *   NaN in a loses to a number in b (the result then is b). This is what
 *   x86's maxps/minps do, so the vector code needs no extra compare; +0 and
 *   -0 compare equal, and b is returned.
 * - fp16, bf16 and fp8 are widened to float, combined in float (PreMulSum's
 *   b * scalar too), and rounded once, to nearest even; fp8 saturates to its
 *   largest finite value. a + b * s is never contracted to an FMA, so
 *   every ISA gives the same bits. The float paths assume the default
 *   rounding mode (nearest even), as any float arithmetic here does.
 * - Avg's integer division (postdiv) truncates toward zero, signed types as
 *   signed values. A divisor of 1 or less divides nothing (Avg's divisor is
 *   nranks). Floats are not expected to carry postdiv (their Avg is a
 *   premul); when they do, a slow path divides in double after the loop.
 * - premul with Max, Min or Prod multiplies b before combining, through a
 *   buffer on the stack; the API only ever pairs premul with Sum.
 * - AND, OR and XOR (Loom's bitwise operators) exist for the integer types
 *   only, and never carry premul or postdiv.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "exec/reduce.h"

#include <string.h>

#include "common/dtype.h"

/* x86-64-v4 is AVX-512 F+BW+DQ+VL: BW lets the 8- and 16-bit loops use
 * 512-bit vectors too (with F alone gcc stays at 256 bits there). Older
 * gcc cannot name it. LOOM_NO_TARGET_CLONES builds the plain loops only. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(LOOM_NO_TARGET_CLONES)
#if __GNUC__ >= 12 && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#define HAVE_AVX512() __builtin_cpu_supports("x86-64-v4")
#else
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define HAVE_AVX512() __builtin_cpu_supports("avx512f")
#endif
#define HAVE_CLONES 1
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#else
#define CLONES
#define HAVE_CLONES 0
#endif

/* Every ISA must give the same bits: no FMA contraction of a + b * s
 * (gcc contracts across statements in GNU C modes). Exception flags are
 * nobody's business here, and without trapping math gcc may compute both
 * sides of a select, which the conversions' vector code needs. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

#define INLINE static inline __attribute__((always_inline))

/* No iteration depends on another's store (see Loops below). */
#if defined(__clang__)
#define IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define IVDEP _Pragma("GCC ivdep")
#endif

/* Element types that may sit at any address: user buffers and FIFO slots
 * promise no alignment. may_alias because callers fill buffers as bytes. */
typedef uint8_t u8a;
typedef int8_t i8a;
typedef uint16_t u16a __attribute__((aligned(1), may_alias));
typedef uint32_t u32a __attribute__((aligned(1), may_alias));
typedef int32_t i32a __attribute__((aligned(1), may_alias));
typedef uint64_t u64a __attribute__((aligned(1), may_alias));
typedef int64_t i64a __attribute__((aligned(1), may_alias));
typedef float f32a __attribute__((aligned(1), may_alias));
typedef double f64a __attribute__((aligned(1), may_alias));

/* ---- Conversions -------------------------------------------------------
 * The same results as dtype.c's, bit for bit (the unit tests compare them on
 * every value), but with every path computed and the answer selected, since
 * the vectoriser cannot keep branches. The subnormal paths add or subtract
 * a power of two whose unit in the last place is the target's subnormal
 * step, so they round as the FPU does (to nearest even, the mode the whole
 * reduction assumes); DAZ/FTZ cannot change them since no operand or result
 * there is a float subnormal that matters. */

INLINE uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

INLINE float flt(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* A select by mask, not `?:`, where an operand comes from float
 * arithmetic: with `?:` gcc sinks the operation into a branch, which the
 * fp8 loops then keep, unvectorised. */
INLINE uint32_t pick(uint32_t c, uint32_t x, uint32_t y) { return (x & (0u - c)) | (y & (c - 1)); }

/* The magnitude code nearest (ties to even) to the non-NaN float with bits
 * `x` (sign clear) in a format of `m` mantissa bits and bias `b`; it runs
 * past the largest finite code when x is beyond it, for callers to clamp. */
INLINE uint32_t rnd_mag(uint32_t x, const int m, const int b) {
  const int sh = 23 - m;
  /* Normal in the target: rebias and round off sh bits; a carry into the
   * exponent is rounding up to the next binade. */
  uint32_t qn = (x - ((uint32_t)(127 - b) << 23) + (1u << (sh - 1)) - 1 + ((x >> sh) & 1)) >> sh;
  /* Subnormal: adding 2^(24-b-m), whose ulp is the subnormal step, rounds
   * x to a whole number of steps, which are then the low bits. */
  const uint32_t magic = (uint32_t)(151 - b - m) << 23;
  uint32_t qs = bits(flt(x) + flt(magic)) - magic;
  return pick(x < ((uint32_t)(128 - b) << 23), qs, qn);
}

INLINE float h2f(uint16_t h) {
  uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
  /* Normal, inf and NaN: exponent and mantissa moved into place, rebiased
   * by a multiply by 2^-112 (exact; a NaN keeps its payload and turns
   * quiet, as dtype.c does). */
  float norm = flt((two_w >> 4) + (0xE0u << 23)) * 0x1p-112f;
  /* Subnormal: the 10 bits as the fraction of 0.5, minus 0.5 (exact). */
  float sub = flt((two_w >> 17) | (126u << 23)) - 0.5f;
  return flt(sign | pick(two_w < (1u << 27), bits(sub), bits(norm)));
}

INLINE uint16_t f2h(float f) {
  uint32_t x = bits(f), sign = (x >> 16) & 0x8000, a = x & 0x7FFFFFFF;
  uint32_t q = rnd_mag(a, 10, 15);
  q = q > 0x7C00 ? 0x7C00 : q;
  q = a > 0x7F800000 ? 0x7E00 | ((a >> 13) & 0x1FF) : q;
  return (uint16_t)(sign | q);
}

INLINE float b2f(uint16_t v) { return flt((uint32_t)v << 16); }

INLINE uint16_t f2b(float f) {
  uint32_t x = bits(f);
  uint32_t r = (x + 0x7FFF + ((x >> 16) & 1)) >> 16;
  return (uint16_t)((x & 0x7FFFFFFF) > 0x7F800000 ? (x >> 16) | 0x40 : r);
}

INLINE float e4m3f(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80) << 24, mag = v & 0x7F;
  uint32_t norm = (mag << 20) + (120u << 23);
  float sub = flt((141u << 23) | mag) - 0x1p14f; /* 2^14's ulp is 2^-9 */
  return flt(sign | pick(mag < 8, bits(sub), mag == 0x7F ? 0x7FC00000 : norm));
}

INLINE uint8_t fe4m3(float f) {
  uint32_t x = bits(f), sign = (x >> 24) & 0x80, a = x & 0x7FFFFFFF;
  uint32_t q = rnd_mag(a, 3, 7);
  q = q > 0x7E ? 0x7E : q;
  q = a > 0x7F800000 ? 0x7F : q;
  return (uint8_t)(sign | q);
}

/* e5m2 is the upper byte of a half. */
INLINE float e5m2f(uint8_t v) { return h2f((uint16_t)(v << 8)); }

INLINE uint8_t fe5m2(float f) {
  uint32_t x = bits(f), sign = (x >> 24) & 0x80, a = x & 0x7FFFFFFF;
  uint32_t q = rnd_mag(a, 2, 15);
  q = q > 0x7B ? 0x7B : q;
  q = a > 0x7F800000 ? 0x7E : q;
  return (uint8_t)(sign | q);
}

/* ---- Loops -------------------------------------------------------------
 * gcc -O2 vectorises only loops whose vector code needs neither a scalar
 * epilogue nor a run-time alias check (its "very cheap" cost model). So
 * every loop runs over blocks of a constant BLK elements, then over the
 * tail; and `ivdep` states what the header promises: dst is a, b, or
 * neither, so no iteration reads what another one stored. */
#define BLK 1024

#define ID(x) (x)
#define S_NONE(op) 0
#define S_U(op) ((op)->scalar.u) /* truncated to the type: wraps as i would */
#define S_F32(op) ((float)(op)->scalar.f)
#define S_F64(op) ((op)->scalar.f)
#define S_DIV(op) ((op)->divisor)

#define LOOP2(name, ST, CT, SCT, LD, SV, EXPR)                                                     \
  INLINE void name##_blk(ST *d, ST *d2, const ST *a, const ST *b, size_t m, SCT s) {               \
    (void)s;                                                                                       \
    if (d2) {                                                                                      \
      IVDEP for (size_t j = 0; j < m; j++) {                                                       \
        CT x = LD(a[j]), y = LD(b[j]);                                                             \
        ST r = SV(EXPR);                                                                           \
        d[j] = r;                                                                                  \
        d2[j] = r;                                                                                 \
      }                                                                                            \
    } else {                                                                                       \
      IVDEP for (size_t j = 0; j < m; j++) {                                                       \
        CT x = LD(a[j]), y = LD(b[j]);                                                             \
        d[j] = SV(EXPR);                                                                           \
      }                                                                                            \
    }                                                                                              \
  }

#define LOOP1(name, ST, CT, SCT, LD, SV, EXPR)                                                     \
  INLINE void name##_blk(ST *d, ST *d2, const ST *a, size_t m, SCT s) {                            \
    if (d2) {                                                                                      \
      IVDEP for (size_t j = 0; j < m; j++) {                                                       \
        CT x = LD(a[j]);                                                                           \
        ST r = SV(EXPR);                                                                           \
        d[j] = r;                                                                                  \
        d2[j] = r;                                                                                 \
      }                                                                                            \
    } else {                                                                                       \
      IVDEP for (size_t j = 0; j < m; j++) {                                                       \
        CT x = LD(a[j]);                                                                           \
        d[j] = SV(EXPR);                                                                           \
      }                                                                                            \
    }                                                                                              \
  }

#define OFF(p, i) ((p) ? (p) + (i) : NULL)

/* dst[i] = a[i] OP b[i] */
#define RED(name, ST, CT, SCT, SCAL, LD, SV, EXPR)                                                 \
  LOOP2(name, ST, CT, SCT, LD, SV, EXPR)                                                           \
  CLONES static void name(void *dv, void *d2v, const void *av, const void *bv, size_t n,           \
                          const struct red_op *op) {                                               \
    ST *d = dv, *d2 = d2v;                                                                         \
    const ST *a = av, *b = bv;                                                                     \
    SCT s = (SCT)SCAL(op);                                                                         \
    size_t i = 0;                                                                                  \
    (void)op;                                                                                      \
    for (; n - i >= BLK; i += BLK)                                                                 \
      name##_blk(d + i, OFF(d2, i), a + i, b + i, BLK, s);                                         \
    name##_blk(d + i, OFF(d2, i), a + i, b + i, n - i, s);                                         \
  }

/* dst[i] = F(src[i]) */
#define MAP(name, ST, CT, SCT, SCAL, LD, SV, EXPR)                                                 \
  LOOP1(name, ST, CT, SCT, LD, SV, EXPR)                                                           \
  CLONES static void name(void *dv, void *d2v, const void *av, size_t n, const struct red_op *op) { \
    ST *d = dv, *d2 = d2v;                                                                         \
    const ST *a = av;                                                                              \
    SCT s = (SCT)SCAL(op);                                                                         \
    size_t i = 0;                                                                                  \
    for (; n - i >= BLK; i += BLK)                                                                 \
      name##_blk(d + i, OFF(d2, i), a + i, BLK, s);                                                \
    name##_blk(d + i, OFF(d2, i), a + i, n - i, s);                                                \
  }

/* Sum, Prod, the scalar's multiply and the bitwise operators are the same
 * bits for signed and unsigned integers, so only the unsigned loops exist. The casts bring
 * uint8's promotion to int back to 8 bits. */
#define UINT_LOOPS(t, ST, T)                                                                       \
  RED(t##_sum, ST, T, T, S_NONE, ID, ID, (T)(x + y))                                               \
  RED(t##_prod, ST, T, T, S_NONE, ID, ID, (T)(x * y))                                              \
  RED(t##_pmsum, ST, T, T, S_U, ID, ID, (T)(x + y * s))                                            \
  MAP(t##_mul, ST, T, T, S_U, ID, ID, (T)(x * s))                                                  \
  RED(t##_band, ST, T, T, S_NONE, ID, ID, (T)(x & y))                                              \
  RED(t##_bor, ST, T, T, S_NONE, ID, ID, (T)(x | y))                                               \
  RED(t##_bxor, ST, T, T, S_NONE, ID, ID, (T)(x ^ y))

#define ORD_LOOPS(t, ST, T)                                                                        \
  RED(t##_max, ST, T, T, S_NONE, ID, ID, x > y ? x : y)                                            \
  RED(t##_min, ST, T, T, S_NONE, ID, ID, x < y ? x : y)

UINT_LOOPS(u8, u8a, uint8_t)
UINT_LOOPS(u32, u32a, uint32_t)
UINT_LOOPS(u64, u64a, uint64_t)
ORD_LOOPS(i8, i8a, int8_t)
ORD_LOOPS(u8, u8a, uint8_t)
ORD_LOOPS(i32, i32a, int32_t)
ORD_LOOPS(u32, u32a, uint32_t)
ORD_LOOPS(i64, i64a, int64_t)
ORD_LOOPS(u64, u64a, uint64_t)

/* Up to 32 bits the quotient in double is exact (|x| < 2^53, so the error
 * is below the 1/divisor gap to the next integer) and truncating it is C's
 * division; unlike the integer divide, it vectorises. */
MAP(i8_div, i8a, int8_t, double, S_DIV, ID, ID, (int8_t)((double)x / s))
MAP(u8_div, u8a, uint8_t, double, S_DIV, ID, ID, (uint8_t)((double)x / s))
MAP(i32_div, i32a, int32_t, double, S_DIV, ID, ID, (int32_t)((double)x / s))
MAP(u32_div, u32a, uint32_t, double, S_DIV, ID, ID, (uint32_t)((double)x / s))
MAP(i64_div, i64a, int64_t, int64_t, S_DIV, ID, ID, x / s)
MAP(u64_div, u64a, uint64_t, uint64_t, S_DIV, ID, ID, x / s)

#define FLOAT_LOOPS(t, ST, CT, SCAL, LD, SV)                                                       \
  RED(t##_sum, ST, CT, CT, S_NONE, LD, SV, x + y)                                                  \
  RED(t##_prod, ST, CT, CT, S_NONE, LD, SV, x * y)                                                 \
  RED(t##_max, ST, CT, CT, S_NONE, LD, SV, x > y ? x : y)                                          \
  RED(t##_min, ST, CT, CT, S_NONE, LD, SV, x < y ? x : y)                                          \
  RED(t##_pmsum, ST, CT, CT, SCAL, LD, SV, x + y * s)                                              \
  MAP(t##_mul, ST, CT, CT, SCAL, LD, SV, x * s)

FLOAT_LOOPS(f32, f32a, float, S_F32, ID, ID)
FLOAT_LOOPS(f64, f64a, double, S_F64, ID, ID)
FLOAT_LOOPS(f16, u16a, float, S_F32, h2f, f2h)
FLOAT_LOOPS(bf16, u16a, float, S_F32, b2f, f2b)
FLOAT_LOOPS(e4m3, u8a, float, S_F32, e4m3f, fe4m3)
FLOAT_LOOPS(e5m2, u8a, float, S_F32, e5m2f, fe5m2)

#if HAVE_CLONES
/* F16C converts 8 halves per instruction, rounding to nearest even and
 * quieting NaNs with their payload kept, exactly as h2f and f2h; maxps and
 * minps are `a > b ? a : b` and `a < b ? a : b` to the letter. The portable
 * loops above finish the tail. */
#define F16C_FN __attribute__((target("avx,f16c")))
#define LD8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define ST8(p, v) _mm_storeu_si128((__m128i *)(void *)(p), _mm256_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT))

#define F16C_RED(name, tail, EXPR)                                                                 \
  F16C_FN static void name(void *dv, void *d2v, const void *av, const void *bv, size_t n,          \
                           const struct red_op *op) {                                              \
    u16a *d = dv, *d2 = d2v;                                                                       \
    const u16a *a = av, *b = bv;                                                                   \
    __m256 s = _mm256_set1_ps((float)op->scalar.f);                                                \
    size_t i = 0;                                                                                  \
    (void)s;                                                                                       \
    for (; n - i >= 8; i += 8) {                                                                   \
      __m256 x = LD8(a + i), y = LD8(b + i), r = EXPR;                                             \
      ST8(d + i, r);                                                                               \
      if (d2)                                                                                      \
        ST8(d2 + i, r);                                                                            \
    }                                                                                              \
    tail##_blk(d + i, OFF(d2, i), a + i, b + i, n - i, (float)op->scalar.f);                       \
  }

F16C_RED(f16c_sum, f16_sum, _mm256_add_ps(x, y))
F16C_RED(f16c_prod, f16_prod, _mm256_mul_ps(x, y))
F16C_RED(f16c_max, f16_max, _mm256_max_ps(x, y))
F16C_RED(f16c_min, f16_min, _mm256_min_ps(x, y))
F16C_RED(f16c_pmsum, f16_pmsum, _mm256_add_ps(x, _mm256_mul_ps(y, s)))

F16C_FN static void f16c_mul(void *dv, void *d2v, const void *av, size_t n, const struct red_op *op) {
  u16a *d = dv, *d2 = d2v;
  const u16a *a = av;
  __m256 s = _mm256_set1_ps((float)op->scalar.f);
  size_t i = 0;
  for (; n - i >= 8; i += 8) {
    __m256 r = _mm256_mul_ps(LD8(a + i), s);
    ST8(d + i, r);
    if (d2)
      ST8(d2 + i, r);
  }
  f16_mul_blk(d + i, OFF(d2, i), a + i, n - i, (float)op->scalar.f);
}
#endif

/* ---- Dispatch ---------------------------------------------------------- */

typedef void red_fn(void *, void *, const void *, const void *, size_t, const struct red_op *);
typedef void map_fn(void *, void *, const void *, size_t, const struct red_op *);

struct kset {
  red_fn *red[7]; /* by enum red_kind; the bitwise ones NULL for floats */
  red_fn *pmsum;  /* a + b * scalar */
  map_fn *mul;    /* src * scalar */
  map_fn *div;    /* src / divisor; NULL for floats */
};

static const struct kset kern[ncclNumTypes] = {
    [ncclInt8] = {{u8_sum, u8_prod, i8_max, i8_min, u8_band, u8_bor, u8_bxor}, u8_pmsum, u8_mul, i8_div},
    [ncclUint8] = {{u8_sum, u8_prod, u8_max, u8_min, u8_band, u8_bor, u8_bxor}, u8_pmsum, u8_mul, u8_div},
    [ncclInt32] = {{u32_sum, u32_prod, i32_max, i32_min, u32_band, u32_bor, u32_bxor}, u32_pmsum, u32_mul, i32_div},
    [ncclUint32] = {{u32_sum, u32_prod, u32_max, u32_min, u32_band, u32_bor, u32_bxor}, u32_pmsum, u32_mul, u32_div},
    [ncclInt64] = {{u64_sum, u64_prod, i64_max, i64_min, u64_band, u64_bor, u64_bxor}, u64_pmsum, u64_mul, i64_div},
    [ncclUint64] = {{u64_sum, u64_prod, u64_max, u64_min, u64_band, u64_bor, u64_bxor}, u64_pmsum, u64_mul, u64_div},
    [ncclFloat16] = {{f16_sum, f16_prod, f16_max, f16_min}, f16_pmsum, f16_mul, NULL},
    [ncclFloat32] = {{f32_sum, f32_prod, f32_max, f32_min}, f32_pmsum, f32_mul, NULL},
    [ncclFloat64] = {{f64_sum, f64_prod, f64_max, f64_min}, f64_pmsum, f64_mul, NULL},
    [ncclBfloat16] = {{bf16_sum, bf16_prod, bf16_max, bf16_min}, bf16_pmsum, bf16_mul, NULL},
    [ncclFloat8e4m3] = {{e4m3_sum, e4m3_prod, e4m3_max, e4m3_min}, e4m3_pmsum, e4m3_mul, NULL},
    [ncclFloat8e5m2] = {{e5m2_sum, e5m2_prod, e5m2_max, e5m2_min}, e5m2_pmsum, e5m2_mul, NULL},
};

#if HAVE_CLONES
static const struct kset kern_f16c = {{f16c_sum, f16c_prod, f16c_max, f16c_min}, f16c_pmsum, f16c_mul, NULL};

/* AVX2 (its check includes the OS saving YMM state) and F16C, asked once. */
static int have_f16c(void) {
  static _Atomic int known = -1;
  int v = atomic_load_explicit(&known, memory_order_relaxed);
  if (v < 0) {
    unsigned a, b, c, d;
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    atomic_store_explicit(&known, v, memory_order_relaxed);
  }
  return v;
}
#endif

static const struct kset *kset_of(int dtype) {
#if HAVE_CLONES
  if (dtype == ncclFloat16 && have_f16c())
    return &kern_f16c;
#endif
  return &kern[dtype];
}

/* The API refuses what has no kernel (a bitwise op on a float); the
 * executor then has nothing to do that it cannot. */
static int op_ok(const struct red_op *op) {
  return op->dtype >= 0 && op->dtype < ncclNumTypes && op->kind >= RED_SUM && op->kind <= RED_BXOR &&
         kern[op->dtype].red[op->kind] && (!op->premul || op->kind <= RED_MIN);
}

static int divides(const struct red_op *op, int final) { return final && op->postdiv && op->divisor > 1; }

#define AT(p, i, es) ((p) ? (char *)(p) + (i) * (es) : NULL)
#define CAT(p, i, es) ((const char *)(p) + (i) * (es))

/* dst = src / divisor, dst2 too; dst may be src. */
static void postdiv(const struct red_op *op, void *dst, void *dst2, const void *src, size_t n) {
  if (kern[op->dtype].div) {
    kern[op->dtype].div(dst, dst2, src, n, op);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    double v = dtype_load(op->dtype, src, i) / op->divisor;
    dtype_store(op->dtype, dst, i, v);
    if (dst2)
      dtype_store(op->dtype, dst2, i, v);
  }
}

void red_reduce(const struct red_op *op, void *dst, void *dst2, const void *a, const void *b,
                size_t n, int final) {
  if (n == 0 || !op_ok(op))
    return;
  const struct kset *k = kset_of(op->dtype);
  int div = divides(op, final);
  void *d2 = div ? NULL : dst2; /* the division writes dst2 */
  if (!op->premul) {
    k->red[op->kind](dst, d2, a, b, n, op);
  } else if (op->kind == RED_SUM) {
    k->pmsum(dst, d2, a, b, n, op);
  } else {
    /* Each piece of b is read into tmp before dst's piece is written, so
     * dst may still be b. */
    _Alignas(64) unsigned char tmp[4096];
    size_t es = dtype_size(op->dtype), per = sizeof tmp / es;
    for (size_t i = 0; i < n; i += per) {
      size_t m = n - i < per ? n - i : per;
      k->mul(tmp, NULL, CAT(b, i, es), m, op);
      k->red[op->kind](AT(dst, i, es), AT(d2, i, es), CAT(a, i, es), tmp, m, op);
    }
  }
  if (div)
    postdiv(op, dst, dst2, dst, n);
}

void red_copy(const struct red_op *op, void *dst, void *dst2, const void *src, size_t n, int final) {
  if (n == 0 || !op_ok(op))
    return;
  int div = divides(op, final);
  if (op->premul) {
    kset_of(op->dtype)->mul(dst, div ? NULL : dst2, src, n, op);
    if (div)
      postdiv(op, dst, dst2, dst, n);
  } else if (div) {
    postdiv(op, dst, dst2, src, n);
  } else {
    size_t bytes = n * dtype_size(op->dtype);
    if (dst != src)
      memcpy(dst, src, bytes);
    if (dst2 && dst2 != src)
      memcpy(dst2, src, bytes);
  }
}

const char *red_isa(void) {
#if HAVE_CLONES
  /* The same test the target_clones resolvers make. */
  __builtin_cpu_init();
  if (HAVE_AVX512())
    return "avx512";
  if (__builtin_cpu_supports("avx2"))
    return "avx2";
#endif
  return "generic";
}
