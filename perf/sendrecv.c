/*
 * sendrecv_perf: each rank sends its buffer to rank+1 and receives from
 * rank-1 in one group (a ring shift). busbw = algbw. In place (sending and
 * receiving the same buffer) is timed but not checked, as in nccl-tests.
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
  int to = (c->rank + 1) % c->nranks, from = (c->rank - 1 + c->nranks) % c->nranks;
  PERF_NCCL(ncclGroupStart());
  PERF_NCCL(ncclSend(sendbuff, c->count, c->type, to, c->comm, c->stream));
  PERF_NCCL(ncclRecv(recvbuff, c->count, c->type, from, c->comm, c->stream));
  PERF_NCCL(ncclGroupEnd());
  return ncclSuccess;
}

static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  (void)in_place;
  *src = (perf_src){.kind = PERF_SRC_COPY, .rank = (c->rank - 1 + c->nranks) % c->nranks,
                    .index = j};
}

static const perf_bench bench = {.name = "SendRecv", .busbw_factor = busbw_factor,
                                 .counts = counts, .run = run, .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
