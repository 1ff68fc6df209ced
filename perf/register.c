/* SPDX-License-Identifier: Apache-2.0 */
#include "register.h"

#include <stdlib.h>

void *perf_reg_alloc(int mode, size_t bytes, const char **why) {
  *why = NULL;
  if (mode != 2)
    return aligned_alloc(4096, bytes);
  void *p = NULL;
  if (ncclMemAlloc(&p, bytes) != ncclSuccess) {
    *why = ncclGetLastError(NULL);
    return NULL;
  }
  return p;
}

void perf_reg_free(int mode, void *p) {
  if (mode == 2)
    ncclMemFree(p);
  else
    free(p);
}

ncclResult_t perf_reg_register(ncclComm_t comm, int mode, void *p, size_t bytes, perf_reg *out) {
  *out = (perf_reg){.mode = mode};
  if (mode == 1)
    return ncclCommRegister(comm, p, bytes, &out->handle);
  if (mode == 2)
    return ncclCommWindowRegister(comm, p, bytes, &out->win, NCCL_WIN_COLL_SYMMETRIC);
  return ncclSuccess;
}

ncclResult_t perf_reg_release(ncclComm_t comm, perf_reg *reg) {
  ncclResult_t r = ncclSuccess;
  if (reg->mode == 1 && reg->handle)
    r = ncclCommDeregister(comm, reg->handle);
  if (reg->mode == 2 && reg->win)
    r = ncclCommWindowDeregister(comm, reg->win);
  reg->handle = NULL;
  reg->win = NULL;
  return r;
}
