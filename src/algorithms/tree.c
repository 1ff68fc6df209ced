/* Tree AllReduce (see schedule.h). Peer 0 is the parent, 1.. the children.
 * SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "algorithms/schedule.h"

#include <string.h>

ncclResult_t tree_schedule(int parent, const int *children, int nchildren, size_t off, size_t len, size_t chunk,
                           struct schedule *out, struct sched_peers *peers) {
  out->nsteps = 0; /* keeps the steps buffer of an earlier schedule */
  memset(peers, 0, sizeof *peers);
  if (nchildren + 1 > WORK_MAX_PEERS || chunk == 0)
    return err_set(ncclInternalError, "tree schedule with %d children and chunk %zu", nchildren, chunk);
  peers->nsend = peers->nrecv = nchildren + 1;
  peers->send[0] = peers->recv[0] = parent; /* unused at the root */
  for (int k = 0; k < nchildren; k++)
    peers->send[1 + k] = peers->recv[1 + k] = children[k];
  const int partial = STEP_SRC_DST | STEP_NO_PREMUL;
  /* Up: every chunk reduced from the children, then passed to the parent.
   * All of them before any comes down, so the two directions of a chunk
   * never wait on each other. */
  for (size_t base = off; base < off + len; base += chunk) {
    size_t n = LOOM_MIN(chunk, off + len - base);
    if (nchildren == 0) {
      CHECK(schedule_push_peer(out, STEP_SEND, 0, 0, 0, base, base, n));
      continue;
    }
    for (int k = 0; k < nchildren; k++) {
      int last = k == nchildren - 1 && parent < 0 ? STEP_FINAL : 0;
      CHECK(schedule_push_peer(out, STEP_RECV_REDUCE_COPY, (k ? partial : 0) | last, 0, 1 + k, base, base, n));
    }
    if (parent >= 0)
      CHECK(schedule_push_peer(out, STEP_SEND, partial, 0, 0, base, base, n));
  }
  /* Down: the result from the parent, on to each child. */
  for (size_t base = off; base < off + len; base += chunk) {
    size_t n = LOOM_MIN(chunk, off + len - base);
    int k = 0;
    if (parent >= 0) {
      if (nchildren > 0) {
        CHECK(schedule_push_peer(out, STEP_RECV_COPY_SEND, 0, 1, 0, base, base, n));
        k = 1;
      } else {
        CHECK(schedule_push_peer(out, STEP_RECV, 0, 0, 0, base, base, n));
      }
    }
    for (; k < nchildren; k++)
      CHECK(schedule_push_peer(out, STEP_SEND, partial, 1 + k, 0, base, base, n));
  }
  return ncclSuccess;
}
