/* Recursive doubling AllReduce (see schedule.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "algorithms/schedule.h"

#include <string.h>

/* Every step is over the whole buffer: one loop of one iteration. */
static ncclResult_t build(int rank, int nranks, int p, int rounds, size_t count, struct schedule *out,
                          struct sched_peers *peers) {
  const int rel = TMPL_REL_SRC | TMPL_REL_DST;
  CHECK(schedule_loop(out, 0, count, count, count, 1));
  if (rank >= p) {
    /* Fold the input into rank - p, then take the result back. */
    peers->nsend = peers->nrecv = 1;
    peers->send[0] = peers->recv[0] = rank - p;
    CHECK(schedule_tmpl(out, STEP_SEND, 0, 0, 0, 0, rel, 0, 0));
    return schedule_tmpl(out, STEP_RECV, 0, 0, 0, 0, rel, 0, 0);
  }
  for (int k = 0; k < rounds; k++)
    peers->send[k] = peers->recv[k] = rank ^ (1 << k);
  peers->nsend = peers->nrecv = rounds;
  int fold = rank + p < nranks;
  /* The partial result is in the receive buffer after the first step that
   * produces one; until then the local input is the send buffer. */
  int partial = 0;
  if (fold) {
    peers->send[rounds] = peers->recv[rounds] = rank + p;
    peers->nsend = peers->nrecv = rounds + 1;
    CHECK(schedule_tmpl(out, STEP_RECV_REDUCE_COPY, 0, 0, rounds, 0, rel, 0, 0));
    partial = STEP_SRC_DST | STEP_NO_PREMUL;
  }
  for (int k = 0; k < rounds; k++) {
    CHECK(schedule_tmpl(out, STEP_SEND, partial, k, 0, 0, rel, 0, 0));
    int last = k == rounds - 1 ? STEP_FINAL : 0;
    CHECK(schedule_tmpl(out, STEP_RECV_REDUCE_COPY, partial | last, 0, k, 0, rel, 0, 0));
    partial = STEP_SRC_DST | STEP_NO_PREMUL;
  }
  if (fold)
    CHECK(schedule_tmpl(out, STEP_SEND, partial, rounds, 0, 0, rel, 0, 0));
  return ncclSuccess;
}

ncclResult_t rd_schedule(int rank, int nranks, size_t count, struct schedule *out, struct sched_peers *peers) {
  schedule_clear(out); /* keeps the template buffer of an earlier schedule */
  memset(peers, 0, sizeof *peers);
  if (nranks < 2 || count == 0)
    return err_set(ncclInternalError, "recursive doubling asked for %d ranks and %zu elements", nranks, count);
  int p = 1, rounds = 0;
  while (p <= nranks / 2) { /* p * 2 could overflow */
    p *= 2;
    rounds++;
  }
  if (rounds + 1 > WORK_MAX_PEERS)
    return err_set(ncclInternalError, "recursive doubling over %d ranks needs more than %d peers", nranks,
                   WORK_MAX_PEERS);
  return schedule_finish(out, build(rank, nranks, p, rounds, count, out, peers));
}
