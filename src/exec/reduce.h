/*
 * The reduction kernels of the host executor: every datatype with Sum,
 * Prod, Max and Min, the integer types with Loom's bitwise AND, OR and XOR,
 * plus the two modifiers NCCL's Avg and PreMulSum need
 * (multiply the local input by a scalar where it enters the reduction;
 * divide the final result by an integer). fp16, bf16 and fp8 are computed in
 * fp32 and rounded once per call.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_REDUCE_H
#define LOOM_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "common/red_op.h"

/* dst[i] = a[i] OP b'[i], where b' is b multiplied by the scalar when
 * op->premul; a is a peer's partial result, b this rank's input. When
 * `final` and op->postdiv the result is then divided. dst2, if not NULL,
 * receives the same values. Any alignment; dst may equal a or b. */
void red_reduce(const struct red_op *op, void *dst, void *dst2, const void *a, const void *b,
                size_t n, int final);

/* dst[i] = src'[i], with src' = src times the scalar when op->premul, then
 * divided when `final` and op->postdiv: the local input entering a
 * reduction without a peer value (first send of a ring, single rank). */
void red_copy(const struct red_op *op, void *dst, void *dst2, const void *src, size_t n, int final);

/* Name of the kernel family chosen at run time ("avx512", "avx2",
 * "generic"), for the INFO log. */
const char *red_isa(void);

#endif
