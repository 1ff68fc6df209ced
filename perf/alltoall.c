/*
 * alltoall_perf: ncclAlltoAll (NCCL 2.28's): every rank sends slot p of
 * its buffer to rank p and receives rank p's slot for it into its own slot
 * p. busbw = algbw * (n-1)/n. AlltoAll has no in-place form (a slot would
 * be overwritten before it is sent), and Loom refuses overlapping buffers,
 * so the in-place half of each line is N/A.
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
  PERF_NCCL(ncclAlltoAll(sendbuff, recvbuff, c->count, c->type, c->comm, c->stream));
  return ncclSuccess;
}

/* Slot p comes from rank p, which sent its slot for us (our rank). */
static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  (void)in_place;
  *src = (perf_src){.kind = PERF_SRC_COPY, .rank = (int)(j / c->count),
                    .index = (size_t)c->rank * c->count + j % c->count};
}

static const perf_bench bench = {.name = "AlltoAll", .no_in_place = 1, .busbw_factor = busbw_factor,
                                 .counts = counts, .run = run, .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
