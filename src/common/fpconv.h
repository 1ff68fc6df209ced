/*
 * Exact conversions of the 16- and 8-bit float formats to and from fp32
 * (round to nearest even; fp8 saturating to the largest finite value, as
 * CUDA's __NV_SATFINITE; NaN stays NaN), in plain integer arithmetic, for
 * the host (dtype.c's reference versions) and for GPU kernels built where
 * the vendor's headers lack a conversion (HIP 5.2 has no fp8 and no bf16
 * intrinsics). One source, so that a kernel of either vendor and a CPU
 * rank round alike.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_FPCONV_H
#define LOOM_FPCONV_H

#include <stdint.h>
#include <string.h>

#include "core.h"

#define FPCONV_FN LOOM_HOST_DEVICE static inline

FPCONV_FN uint32_t fpconv_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

FPCONV_FN float fpconv_float(uint32_t u) {
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
FPCONV_FN uint32_t fpconv_round_magnitude(uint32_t x, int m, int bias) {
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
FPCONV_FN float fpconv_decode_magnitude(uint32_t e, uint32_t mant, int m, int bias) {
  if (e == 0) /* exact: mant has at most 10 bits */
    return (float)mant * fpconv_float((uint32_t)(127 + 1 - bias - m) << 23);
  return fpconv_float(((e + 127 - (uint32_t)bias) << 23) | (mant << (23 - m)));
}

FPCONV_FN float fpconv_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (e == 31) /* inf, or NaN made quiet with its payload kept */
    return fpconv_float(sign | 0x7F800000 | (mant << 13) | (mant ? 0x400000 : 0));
  return fpconv_float(sign | fpconv_bits(fpconv_decode_magnitude(e, mant, 10, 15)));
}

FPCONV_FN uint16_t fpconv_float_to_half(float f) {
  uint32_t x = fpconv_bits(f), sign = (x >> 16) & 0x8000;
  x &= 0x7FFFFFFF;
  if (x > 0x7F800000)
    return (uint16_t)(sign | 0x7E00 | ((x >> 13) & 0x1FF));
  uint32_t q = fpconv_round_magnitude(x, 10, 15);
  return (uint16_t)(sign | (q > 0x7C00 ? 0x7C00 : q)); /* overflow is inf */
}

FPCONV_FN float fpconv_bf16_to_float(uint16_t b) { return fpconv_float((uint32_t)b << 16); }

FPCONV_FN uint16_t fpconv_float_to_bf16(float f) {
  uint32_t x = fpconv_bits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000)
    return (uint16_t)((x >> 16) | 0x40);
  /* The carry of rounding up runs into the exponent, up to inf at most. */
  return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

FPCONV_FN float fpconv_e4m3_to_float(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80) << 24, e = (v >> 3) & 0xF, mant = v & 7;
  if (e == 15 && mant == 7) /* E4M3FN: no infinities, one NaN per sign */
    return fpconv_float(sign | 0x7FC00000);
  return fpconv_float(sign | fpconv_bits(fpconv_decode_magnitude(e, mant, 3, 7)));
}

/* SATFINITE, as CUDA's __nv_cvt_float_to_fp8: everything beyond 448,
 * infinities included, becomes 448. */
FPCONV_FN uint8_t fpconv_float_to_e4m3(float f) {
  uint32_t x = fpconv_bits(f), sign = (x >> 24) & 0x80;
  x &= 0x7FFFFFFF;
  if (x > 0x7F800000)
    return (uint8_t)(sign | 0x7F);
  uint32_t q = fpconv_round_magnitude(x, 3, 7);
  return (uint8_t)(sign | (q > 0x7E ? 0x7E : q));
}

FPCONV_FN float fpconv_e5m2_to_float(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80) << 24, e = (v >> 2) & 0x1F, mant = v & 3;
  if (e == 31)
    return fpconv_float(sign | 0x7F800000 | (mant << 21) | (mant ? 0x400000 : 0));
  return fpconv_float(sign | fpconv_bits(fpconv_decode_magnitude(e, mant, 2, 15)));
}

/* SATFINITE too: infinities and everything beyond 57344 become 57344. */
FPCONV_FN uint8_t fpconv_float_to_e5m2(float f) {
  uint32_t x = fpconv_bits(f), sign = (x >> 24) & 0x80;
  x &= 0x7FFFFFFF;
  if (x > 0x7F800000)
    return (uint8_t)(sign | 0x7E);
  uint32_t q = fpconv_round_magnitude(x, 2, 15);
  return (uint8_t)(sign | (q > 0x7B ? 0x7B : q));
}

#endif
