/*
 * reduce_scatter_perf: ncclReduceScatter. The size is the whole input; rank
 * r gets the reduction of everyone's slot r. In place, the output is the
 * rank's own slot of the input. busbw = algbw * (n-1)/n.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common.h"

static double busbw_factor(int n) { return (double)(n - 1) / n; }

static void counts(size_t count, int nranks, perf_counts *c) {
  size_t per = count / (size_t)nranks;
  *c = (perf_counts){.sendcount = per * (size_t)nranks, .recvcount = per, .paramcount = per,
                     .recv_inplace_off = per};
}

static ncclResult_t run(const perf_call *c, const void *sendbuff, void *recvbuff) {
  PERF_NCCL(ncclReduceScatter(sendbuff, recvbuff, c->count, c->type, c->op, c->comm, c->stream));
  return ncclSuccess;
}

static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  (void)in_place;
  *src = (perf_src){.kind = PERF_SRC_REDUCE, .index = (size_t)c->rank * c->count + j};
}

static const perf_bench bench = {.name = "ReduceScatter", .uses_op = 1, .checks_in_place = 1,
                                 .busbw_factor = busbw_factor, .counts = counts, .run = run,
                                 .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
