/*
 * all_reduce_perf: ncclAllReduce. Every rank's output is the reduction of
 * all inputs; busbw = algbw * 2(n-1)/n, what a ring moves per rank.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common.h"

static double busbw_factor(int n) { return 2.0 * (n - 1) / n; }

static void counts(size_t count, int nranks, perf_counts *c) {
  (void)nranks;
  *c = (perf_counts){.sendcount = count, .recvcount = count, .paramcount = count};
}

static ncclResult_t run(const perf_call *c, const void *sendbuff, void *recvbuff) {
  PERF_NCCL(ncclAllReduce(sendbuff, recvbuff, c->count, c->type, c->op, c->comm, c->stream));
  return ncclSuccess;
}

static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  (void)c;
  (void)in_place;
  *src = (perf_src){.kind = PERF_SRC_REDUCE, .index = j};
}

static const perf_bench bench = {.name = "AllReduce", .uses_op = 1, .checks_in_place = 1,
                                 .busbw_factor = busbw_factor, .counts = counts, .run = run,
                                 .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
