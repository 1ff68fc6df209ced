/*
 * reduce_perf: ncclReduce to the root (-r). busbw = algbw.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common.h"

static double busbw_factor(int n) {
  (void)n;
  return 1.0;
}

static void counts(size_t count, int nranks, perf_counts *c) {
  (void)nranks;
  *c = (perf_counts){.sendcount = count, .recvcount = count, .paramcount = count};
}

static ncclResult_t run(const perf_call *c, const void *sendbuff, void *recvbuff) {
  PERF_NCCL(ncclReduce(sendbuff, recvbuff, c->count, c->type, c->op, c->root, c->comm, c->stream));
  return ncclSuccess;
}

/* recvbuff matters only at the root; elsewhere, as nccl-tests checks, the
 * call must leave it alone (in place it still holds the rank's input). */
static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  if (c->rank == c->root) *src = (perf_src){.kind = PERF_SRC_REDUCE, .index = j};
  else if (in_place) *src = (perf_src){.kind = PERF_SRC_COPY, .rank = c->rank, .index = j};
  else *src = (perf_src){.kind = PERF_SRC_POISON};
}

static const perf_bench bench = {.name = "Reduce", .uses_op = 1, .uses_root = 1,
                                 .checks_in_place = 1, .busbw_factor = busbw_factor,
                                 .counts = counts, .run = run, .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
