/*
 * The buffers' registration, as nccl-tests' -R asks for it: 0 plain
 * memory, 1 plain memory registered with ncclCommRegister, 2 memory from
 * ncclMemAlloc registered as a symmetric window (ncclCommWindowRegister
 * with NCCL_WIN_COLL_SYMMETRIC), which the ranks of a host share: Loom's
 * flat AllReduce then reads and writes every rank's buffers in place.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_PERF_REGISTER_H
#define LOOM_PERF_REGISTER_H

#include <stddef.h>

#include "nccl.h"

typedef struct {
  int mode;
  void *handle;     /* -R 1 */
  ncclWindow_t win; /* -R 2 */
} perf_reg;

/* `bytes` of host memory, page-aligned, for mode; NULL with errno on a
 * shortage, or with *why set where the library refused. */
void *perf_reg_alloc(int mode, size_t bytes, const char **why);
void perf_reg_free(int mode, void *p);

/* Registers [p, p + bytes) with comm (collective for mode 2). */
ncclResult_t perf_reg_register(ncclComm_t comm, int mode, void *p, size_t bytes, perf_reg *out);
ncclResult_t perf_reg_release(ncclComm_t comm, perf_reg *reg);

#endif
