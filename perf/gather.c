/*
 * gather_perf: ncclGather (NCCL 2.28's) to the root (-r). The size is the
 * root's whole output; each rank contributes size/nranks. In place, each
 * rank's input is its own slot of recvbuff, which on the root is NCCL's
 * in-place form. busbw = algbw * (n-1)/n, as nccl-tests.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common.h"

static double busbw_factor(int n) { return (double)(n - 1) / n; }

static void counts(size_t count, int nranks, perf_counts *c) {
  size_t per = count / (size_t)nranks;
  *c = (perf_counts){.sendcount = per, .recvcount = per * (size_t)nranks, .paramcount = per,
                     .send_inplace_off = per};
}

static ncclResult_t run(const perf_call *c, const void *sendbuff, void *recvbuff) {
  PERF_NCCL(ncclGather(sendbuff, recvbuff, c->count, c->type, c->root, c->comm, c->stream));
  return ncclSuccess;
}

/* The root's slot k holds rank k's input; elsewhere recvbuff is not the
 * call's, except in place where a rank's own slot holds its input. */
static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  int slot = (int)(j / c->count);
  if (c->rank == c->root || (in_place && slot == c->rank))
    *src = (perf_src){.kind = PERF_SRC_COPY, .rank = slot, .index = j % c->count};
  else
    *src = (perf_src){.kind = PERF_SRC_POISON};
}

static const perf_bench bench = {.name = "Gather", .uses_root = 1, .checks_in_place = 1,
                                 .busbw_factor = busbw_factor, .counts = counts, .run = run,
                                 .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
