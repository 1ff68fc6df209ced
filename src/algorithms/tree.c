/* Tree AllReduce (see schedule.h). Peer 0 is the parent, 1.. the children.
 * SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "algorithms/schedule.h"

#include <string.h>

static ncclResult_t build(int parent, int nchildren, size_t off, size_t len, size_t end, size_t chunk,
                          struct schedule *out) {
  const int partial = STEP_SRC_DST | STEP_NO_PREMUL, rel = TMPL_REL_SRC | TMPL_REL_DST;
  size_t iters = len / chunk + (len % chunk != 0);
  /* Up: every chunk reduced from the children, then passed to the parent.
   * All of them before any comes down, so the two directions of a chunk
   * never wait on each other. */
  CHECK(schedule_loop(out, off, chunk, chunk, end, iters));
  if (nchildren == 0)
    CHECK(schedule_tmpl(out, STEP_SEND, 0, 0, 0, 0, rel, 0, 0));
  for (int k = 0; k < nchildren; k++) {
    int last = k == nchildren - 1 && parent < 0 ? STEP_FINAL : 0;
    CHECK(schedule_tmpl(out, STEP_RECV_REDUCE_COPY, (k ? partial : 0) | last, 0, 1 + k, 0, rel, 0, 0));
  }
  if (nchildren > 0 && parent >= 0)
    CHECK(schedule_tmpl(out, STEP_SEND, partial, 0, 0, 0, rel, 0, 0));
  /* Down: the result from the parent, on to each child. The root of a
   * tree of one rank has nothing to do on the way down. */
  if (parent < 0 && nchildren == 0)
    return ncclSuccess;
  CHECK(schedule_loop(out, off, chunk, chunk, end, iters));
  int k = 0;
  if (parent >= 0) {
    if (nchildren > 0) {
      CHECK(schedule_tmpl(out, STEP_RECV_COPY_SEND, 0, 1, 0, 0, rel, 0, 0));
      k = 1;
    } else {
      CHECK(schedule_tmpl(out, STEP_RECV, 0, 0, 0, 0, rel, 0, 0));
    }
  }
  for (; k < nchildren; k++)
    CHECK(schedule_tmpl(out, STEP_SEND, partial, 1 + k, 0, 0, rel, 0, 0));
  return ncclSuccess;
}

ncclResult_t tree_schedule(int parent, const int *children, int nchildren, size_t off, size_t len, size_t chunk,
                           struct schedule *out, struct sched_peers *peers) {
  schedule_clear(out); /* keeps the template buffer of an earlier schedule */
  memset(peers, 0, sizeof *peers);
  size_t end;
  if (nchildren < 0 || nchildren + 1 > WORK_MAX_PEERS || chunk == 0 || __builtin_add_overflow(off, len, &end))
    return err_set(ncclInternalError, "tree schedule with %d children, chunk %zu, range %zu+%zu", nchildren, chunk,
                   off, len);
  peers->nsend = peers->nrecv = nchildren + 1;
  peers->send[0] = peers->recv[0] = parent; /* unused at the root */
  for (int k = 0; k < nchildren; k++)
    peers->send[1 + k] = peers->recv[1 + k] = children[k];
  if (len == 0)
    return ncclSuccess;
  return schedule_finish(out, build(parent, nchildren, off, len, end, chunk, out));
}
