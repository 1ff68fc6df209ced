/*
 * Datatype sizes and names, and the scalar conversions of the small float
 * formats. These are the readable reference versions: reduce.c has its own
 * branch-free copies for its vector loops, and the unit tests check that
 * both agree on every 16- and 8-bit value.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common/dtype.h"

#include <math.h>
#include <string.h>

static const struct {
  const char *name;
  int is_float;
} types[ncclNumTypes] = {
    [ncclInt8] = {"int8", 0},          [ncclUint8] = {"uint8", 0},
    [ncclInt32] = {"int32", 0},        [ncclUint32] = {"uint32", 0},
    [ncclInt64] = {"int64", 0},        [ncclUint64] = {"uint64", 0},
    [ncclFloat16] = {"half", 1},       [ncclFloat32] = {"float", 1},
    [ncclFloat64] = {"double", 1},     [ncclBfloat16] = {"bfloat16", 1},
    [ncclFloat8e4m3] = {"f8e4m3", 1},  [ncclFloat8e5m2] = {"f8e5m2", 1},
};

static int valid(int dtype) { return dtype >= 0 && dtype < ncclNumTypes; }

const char *dtype_name(int dtype) { return valid(dtype) ? types[dtype].name : "unknown"; }

int dtype_is_float(int dtype) { return valid(dtype) && types[dtype].is_float; }

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/*
 * A binary format with `m` mantissa bits and exponent bias `bias`: the
 * magnitude code nearest (ties to even) to the float whose bits, sign
 * cleared and not NaN, are `x`. Past the largest finite value the code just
 * keeps counting; each format clamps it to infinity or to its largest
 * finite value.
 */
static uint32_t round_magnitude(uint32_t x, int m, int bias) {
  int e = (int)(x >> 23);
  uint32_t mant = x & 0x7FFFFF;
  if (e > 127 - bias) {
    /* Normal in the target: rebias, then round the dropped bits. Carries
     * into the exponent are what rounding up to the next binade means. */
    uint32_t r = x - ((uint32_t)(127 - bias) << 23);
    int sh = 23 - m;
    return (r + (1u << (sh - 1)) - 1 + ((r >> sh) & 1)) >> sh;
  }
  /* Subnormal in the target: count units of 2^(1-bias-m). */
  if (e == 0)
    e = 1; /* a float subnormal has no implicit bit, the same scale as e = 1 */
  else
    mant |= 0x800000;
  int sh = 151 - bias - m - e;
  if (sh > 24)
    return 0; /* less than half a unit */
  uint32_t q = mant >> sh, rem = mant & ((1u << sh) - 1), half = 1u << (sh - 1);
  return q + (rem > half || (rem == half && (q & 1)));
}

/* The inverse for normal and subnormal codes (no specials). */
static float decode_magnitude(uint32_t e, uint32_t mant, int m, int bias) {
  if (e == 0) /* exact: mant has at most 10 bits */
    return (float)mant * float_of((uint32_t)(127 + 1 - bias - m) << 23);
  return float_of(((e + 127 - (uint32_t)bias) << 23) | (mant << (23 - m)));
}

float dtype_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (e == 31) /* inf, or NaN made quiet with its payload kept */
    return float_of(sign | 0x7F800000 | (mant << 13) | (mant ? 0x400000 : 0));
  return float_of(sign | bits_of(decode_magnitude(e, mant, 10, 15)));
}

uint16_t dtype_float_to_half(float f) {
  uint32_t x = bits_of(f), sign = (x >> 16) & 0x8000;
  x &= 0x7FFFFFFF;
  if (x > 0x7F800000)
    return (uint16_t)(sign | 0x7E00 | ((x >> 13) & 0x1FF));
  uint32_t q = round_magnitude(x, 10, 15);
  return (uint16_t)(sign | (q > 0x7C00 ? 0x7C00 : q)); /* overflow is inf */
}

float dtype_bf16_to_float(uint16_t b) { return float_of((uint32_t)b << 16); }

uint16_t dtype_float_to_bf16(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000)
    return (uint16_t)((x >> 16) | 0x40);
  /* The carry of rounding up runs into the exponent, up to inf at most. */
  return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

float dtype_e4m3_to_float(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80) << 24, e = (v >> 3) & 0xF, mant = v & 7;
  if (e == 15 && mant == 7) /* E4M3FN: no infinities, one NaN per sign */
    return float_of(sign | 0x7FC00000);
  return float_of(sign | bits_of(decode_magnitude(e, mant, 3, 7)));
}

/* SATFINITE, as CUDA's __nv_cvt_float_to_fp8: everything beyond 448,
 * infinities included, becomes 448. */
uint8_t dtype_float_to_e4m3(float f) {
  uint32_t x = bits_of(f), sign = (x >> 24) & 0x80;
  x &= 0x7FFFFFFF;
  if (x > 0x7F800000)
    return (uint8_t)(sign | 0x7F);
  uint32_t q = round_magnitude(x, 3, 7);
  return (uint8_t)(sign | (q > 0x7E ? 0x7E : q));
}

float dtype_e5m2_to_float(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80) << 24, e = (v >> 2) & 0x1F, mant = v & 3;
  if (e == 31)
    return float_of(sign | 0x7F800000 | (mant << 21) | (mant ? 0x400000 : 0));
  return float_of(sign | bits_of(decode_magnitude(e, mant, 2, 15)));
}

/* SATFINITE too: infinities and everything beyond 57344 become 57344. */
uint8_t dtype_float_to_e5m2(float f) {
  uint32_t x = bits_of(f), sign = (x >> 24) & 0x80;
  x &= 0x7FFFFFFF;
  if (x > 0x7F800000)
    return (uint8_t)(sign | 0x7E);
  uint32_t q = round_magnitude(x, 2, 15);
  return (uint8_t)(sign | (q > 0x7B ? 0x7B : q));
}

/*
 * A double taken modulo 2^64 after truncation toward zero, as the integer
 * stores wrap. NaN and infinities have no residue; they store 0.
 */
static uint64_t wrap_u64(double v) {
  const double two63 = 9223372036854775808.0, two64 = 18446744073709551616.0;
  if (!isfinite(v))
    return 0;
  v = trunc(v);
  if (v >= -two63 && v < two63)
    return (uint64_t)(int64_t)v;
  v = fmod(v, two64); /* exact */
  if (v < -two63)
    v += two64; /* exact too: v is a multiple of 2^11 here */
  else if (v < 0)
    return (uint64_t)(int64_t)v;
  return (uint64_t)v;
}

/* Buffers may be unaligned: elements move through memcpy. */
/* Buffers may be unaligned: elements move through memcpy. */
#define LOADER(T)                                                                                  \
  static T load_##T(const void *buf, size_t i) {                                                   \
    T t;                                                                                           \
    memcpy(&t, (const char *)buf + i * sizeof t, sizeof t);                                        \
    return t;                                                                                      \
  }
#define STORER(T)                                                                                  \
  static void store_##T(void *buf, size_t i, T t) { memcpy((char *)buf + i * sizeof t, &t, sizeof t); }
LOADER(int8_t)
LOADER(int32_t)
LOADER(int64_t)
LOADER(uint8_t)
LOADER(uint16_t)
LOADER(uint32_t)
LOADER(uint64_t)
LOADER(float)
LOADER(double)
STORER(uint8_t)
STORER(uint16_t)
STORER(uint32_t)
STORER(uint64_t)
STORER(float)
STORER(double)

double dtype_load(int dtype, const void *buf, size_t i) {
  switch (dtype) {
  case ncclInt8: return load_int8_t(buf, i);
  case ncclUint8: return load_uint8_t(buf, i);
  case ncclInt32: return load_int32_t(buf, i);
  case ncclUint32: return load_uint32_t(buf, i);
  case ncclInt64: return (double)load_int64_t(buf, i);
  case ncclUint64: return (double)load_uint64_t(buf, i);
  case ncclFloat16: return dtype_half_to_float(load_uint16_t(buf, i));
  case ncclFloat32: return load_float(buf, i);
  case ncclFloat64: return load_double(buf, i);
  case ncclBfloat16: return dtype_bf16_to_float(load_uint16_t(buf, i));
  case ncclFloat8e4m3: return dtype_e4m3_to_float(load_uint8_t(buf, i));
  case ncclFloat8e5m2: return dtype_e5m2_to_float(load_uint8_t(buf, i));
  default: return 0;
  }
}

/* The 16- and 8-bit floats go through float, as every other producer of
 * them here does (the reduction loops compute in float). */
void dtype_store(int dtype, void *buf, size_t i, double v) {
  switch (dtype) {
  case ncclInt8: store_uint8_t(buf, i, (uint8_t)wrap_u64(v)); break;
  case ncclUint8: store_uint8_t(buf, i, (uint8_t)wrap_u64(v)); break;
  case ncclInt32: store_uint32_t(buf, i, (uint32_t)wrap_u64(v)); break;
  case ncclUint32: store_uint32_t(buf, i, (uint32_t)wrap_u64(v)); break;
  case ncclInt64: store_uint64_t(buf, i, wrap_u64(v)); break;
  case ncclUint64: store_uint64_t(buf, i, wrap_u64(v)); break;
  case ncclFloat16: store_uint16_t(buf, i, dtype_float_to_half((float)v)); break;
  case ncclFloat32: store_float(buf, i, (float)v); break;
  case ncclFloat64: store_double(buf, i, v); break;
  case ncclBfloat16: store_uint16_t(buf, i, dtype_float_to_bf16((float)v)); break;
  case ncclFloat8e4m3: store_uint8_t(buf, i, dtype_float_to_e4m3((float)v)); break;
  case ncclFloat8e5m2: store_uint8_t(buf, i, dtype_float_to_e5m2((float)v)); break;
  default: break;
  }
}
