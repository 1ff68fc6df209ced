/*
 * The 12 datatypes of the NCCL API: sizes, names, and exact conversions of
 * the 16- and 8-bit floating types to and from fp32 (round to nearest even).
 * fp8 conversions saturate to the largest finite value, as CUDA's
 * __NV_SATFINITE does; NaN stays NaN.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_DTYPE_H
#define LOOM_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* 0 for a value that is not a datatype. Inline: every call plans with it. */
static inline size_t dtype_size(int dtype) {
  static const unsigned char sizes[ncclNumTypes] = {
      [ncclInt8] = 1,    [ncclUint8] = 1,    [ncclInt32] = 4,     [ncclUint32] = 4,
      [ncclInt64] = 8,   [ncclUint64] = 8,   [ncclFloat16] = 2,   [ncclFloat32] = 4,
      [ncclFloat64] = 8, [ncclBfloat16] = 2, [ncclFloat8e4m3] = 1, [ncclFloat8e5m2] = 1,
  };
  return dtype >= 0 && dtype < ncclNumTypes ? sizes[dtype] : 0;
}
/* nccl-tests' names: int8 uint8 int32 uint32 int64 uint64 half float double
 * bfloat16 f8e4m3 f8e5m2; "unknown" otherwise. */
const char *dtype_name(int dtype);
int dtype_is_float(int dtype);

float dtype_half_to_float(uint16_t h);
uint16_t dtype_float_to_half(float f);
float dtype_bf16_to_float(uint16_t b);
uint16_t dtype_float_to_bf16(float f);
float dtype_e4m3_to_float(uint8_t v);
uint8_t dtype_float_to_e4m3(float f);
float dtype_e5m2_to_float(uint8_t v);
uint8_t dtype_float_to_e5m2(float f);

/* Element `i` of a buffer of `dtype` as a double, and the reverse (rounded
 * as the type rounds; integers wrap). For references and scalars, not for
 * hot loops. */
double dtype_load(int dtype, const void *buf, size_t i);
void dtype_store(int dtype, void *buf, size_t i, double v);

#endif
