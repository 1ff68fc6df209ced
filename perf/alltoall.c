/*
 * alltoall_perf: every rank sends slot p of its buffer to rank p and
 * receives rank p's slot for it into its own slot p. The NCCL 2.27 API has
 * no ncclAlltoAll, so this is one group of ncclSend/ncclRecv to every peer,
 * as nccl-tests does it. busbw = algbw * (n-1)/n. In place is timed but not
 * checked, as in nccl-tests.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common.h"

static double busbw_factor(int n) { return (double)(n - 1) / n; }

static void counts(size_t count, int nranks, perf_counts *c) {
  size_t per = count / (size_t)nranks;
  *c = (perf_counts){.sendcount = per * (size_t)nranks, .recvcount = per * (size_t)nranks,
                     .paramcount = per};
}

static ncclResult_t run(const perf_call *c, const void *sendbuff, void *recvbuff) {
  if (c->count == 0) return ncclSuccess;
  size_t slot = c->count * perf_type_size(c->type);
  PERF_NCCL(ncclGroupStart());
  for (int p = 0; p < c->nranks; p++) {
    PERF_NCCL(ncclSend((const char *)sendbuff + (size_t)p * slot, c->count, c->type, p, c->comm,
                       c->stream));
    PERF_NCCL(ncclRecv((char *)recvbuff + (size_t)p * slot, c->count, c->type, p, c->comm, c->stream));
  }
  PERF_NCCL(ncclGroupEnd());
  return ncclSuccess;
}

/* Slot p comes from rank p, which sent its slot for us (our rank). */
static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  (void)in_place;
  *src = (perf_src){.kind = PERF_SRC_COPY, .rank = (int)(j / c->count),
                    .index = (size_t)c->rank * c->count + j % c->count};
}

static const perf_bench bench = {.name = "AlltoAll", .busbw_factor = busbw_factor,
                                 .counts = counts, .run = run, .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
