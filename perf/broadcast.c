/*
 * broadcast_perf: ncclBroadcast from the root (-r) to every rank.
 * busbw = algbw: every rank receives the whole buffer once.
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
  PERF_NCCL(ncclBroadcast(sendbuff, recvbuff, c->count, c->type, c->root, c->comm, c->stream));
  return ncclSuccess;
}

static void expect(const perf_call *c, int in_place, size_t j, perf_src *src) {
  (void)in_place;
  *src = (perf_src){.kind = PERF_SRC_COPY, .rank = c->root, .index = j};
}

static const perf_bench bench = {.name = "Broadcast", .uses_root = 1, .checks_in_place = 1,
                                 .busbw_factor = busbw_factor, .counts = counts, .run = run,
                                 .expect = expect};

int main(int argc, char **argv) { return perf_main(argc, argv, &bench); }
