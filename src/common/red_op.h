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

enum red_kind { RED_SUM = 0, RED_PROD = 1, RED_MAX = 2, RED_MIN = 3 };

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
