/*
 * Datatype sizes and names, and the scalar conversions of the small float
 * formats. These are the readable reference versions (common/fpconv.h,
 * which kernels built without the vendor's conversions share): reduce.c
 * has its own branch-free copies for its vector loops, and the unit tests
 * check that both agree on every 16- and 8-bit value.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common/dtype.h"
#include "common/fpconv.h"

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

float dtype_half_to_float(uint16_t h) { return fpconv_half_to_float(h); }
uint16_t dtype_float_to_half(float f) { return fpconv_float_to_half(f); }
float dtype_bf16_to_float(uint16_t b) { return fpconv_bf16_to_float(b); }
uint16_t dtype_float_to_bf16(float f) { return fpconv_float_to_bf16(f); }
float dtype_e4m3_to_float(uint8_t v) { return fpconv_e4m3_to_float(v); }
uint8_t dtype_float_to_e4m3(float f) { return fpconv_float_to_e4m3(f); }
float dtype_e5m2_to_float(uint8_t v) { return fpconv_e5m2_to_float(v); }
uint8_t dtype_float_to_e5m2(float f) { return fpconv_float_to_e5m2(f); }

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
