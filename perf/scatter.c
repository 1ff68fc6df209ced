/*
 * scatter_perf: ncclScatter (NCCL 2.28's) from the root (-r). The size is
 * the root's whole input; each rank receives size/nranks. In place, each
 * rank's output is its own slot of the buffer that holds the input, which
 * on the root is NCCL's in-place form. busbw = algbw * (n-1)/n, as
 * nccl-tests.
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
  PERF_NCCL(ncclScatter(sendbuff, recvbuff, c->count, c->type, c->root, c->comm, c->stream));
  return ncclSuccess;
}

/* Every rank's output is the root's slot for it. */
static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  (void)in_place;
  *src = (perf_src){.kind = PERF_SRC_COPY, .rank = c->root, .index = (size_t)c->rank * c->count + j};
}

static const perf_bench bench = {.name = "Scatter", .uses_root = 1, .checks_in_place = 1,
                                 .busbw_factor = busbw_factor, .counts = counts, .run = run,
                                 .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
