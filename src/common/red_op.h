/*
 * A reduction as the executors apply it: the operator, the datatype and
 * the two modifiers NCCL's Avg and PreMulSum need. Part of the call's
 * vocabulary (common/coll.h carries one in every queued call), so it lives
 * on the ground floor; exec/reduce.h has the kernels that apply it.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_RED_OP_H
#define LOOM_RED_OP_H

#include <stdint.h>

#include "loom.h"

/* Loom's bitwise operators are fixed ncclRedOp_t values at the top of the
 * type's range (include/loom.h; docs/decisions.md says why). The whole
 * range is theirs: ncclRedOpCreatePreMulSum hands out handles below it. */
#define RED_OP_RESERVED_FIRST 0x7ffffff0
#ifndef __cplusplus
_Static_assert((int)loomBand == RED_OP_RESERVED_FIRST && (int)loomBor == (int)loomBand + 1 &&
                   (int)loomBxor == (int)loomBand + 2 && (int)ncclMaxRedOp == 0x7fffffff,
               "Loom's operators sit at the start of the reserved range");
#endif

enum red_kind { RED_SUM = 0, RED_PROD = 1, RED_MAX = 2, RED_MIN = 3, RED_BAND = 4, RED_BOR = 5, RED_BXOR = 6 };

/* Whether `op` is loomBand, loomBor or loomBxor. */
static inline int red_op_is_bitwise(int op) { return op >= (int)loomBand && op <= (int)loomBxor; }

/* The one-byte code by which call descriptions, slot headers and the
 * cross-rank check name an operator: NCCL's built-ins as themselves, every
 * PreMulSum handle as one code (handles are per rank), then AND, OR, XOR. */
enum { RED_CODE_PREMUL = 5, RED_CODE_BAND = 6, RED_CODE_BOR = 7, RED_CODE_BXOR = 8 };

static inline int red_op_code(int op) {
  if (op >= 0 && op < 5)
    return op;
  return red_op_is_bitwise(op) ? RED_CODE_BAND + (op - (int)loomBand) : RED_CODE_PREMUL;
}

/* An op value that red_op_code maps back to `code`. */
static inline int red_code_op(int code) {
  return code >= RED_CODE_BAND && code <= RED_CODE_BXOR ? (int)loomBand + (code - RED_CODE_BAND) : code;
}

static inline const char *red_code_name(int code) {
  static const char *names[] = {"sum", "prod", "max", "min", "avg", "premulsum", "band", "bor", "bxor"};
  return code >= 0 && code <= RED_CODE_BXOR ? names[code] : "?";
}

static inline const char *red_op_name(int op) { return red_code_name(red_op_code(op)); }

struct red_op {
  int dtype;   /* ncclDataType_t */
  int kind;    /* enum red_kind */
  /* PreMulSum, and Avg on floating types (scalar 1/nranks in the type):
   * b is multiplied by the scalar before it is combined. */
  int premul;
  union {
    int64_t i;  /* signed integer types */
    uint64_t u; /* unsigned integer types */
    double f;   /* floating types: the scalar's value in its own type */
  } scalar;
  /* Avg on integer types: the final result is divided by `divisor`
   * (C division, truncating toward zero). */
  int postdiv;
  int divisor;
};

#endif
