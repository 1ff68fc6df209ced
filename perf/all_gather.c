/*
 * all_gather_perf: ncclAllGather. The size is the whole output; each rank
 * contributes size/nranks of it. In place, each rank's input is its own
 * slot of the output. busbw = algbw * (n-1)/n.
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
  PERF_NCCL(ncclAllGather(sendbuff, recvbuff, c->count, c->type, c->comm, c->stream));
  return ncclSuccess;
}

/* Output slot k holds rank k's input. */
static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  (void)in_place;
  *src = (perf_src){.kind = PERF_SRC_COPY, .rank = (int)(j / c->count), .index = j % c->count};
}

static const perf_bench bench = {.name = "AllGather", .checks_in_place = 1,
                                 .busbw_factor = busbw_factor, .counts = counts, .run = run,
                                 .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
