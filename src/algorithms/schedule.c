/* Schedules: storage, and the pieces every algorithm shares.
 * SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "algorithms/schedule.h"
#include "enqueue.h"

#include <stdlib.h>
#include <string.h>

static const char *step_names[STEP_KIND_COUNT] = {
    "send", "recv", "copy-send", "recv-copy-send", "recv-reduce-send", "recv-reduce-copy",
    "recv-reduce-copy-send", "copy",
};

const char *step_name(int kind) { return kind >= 0 && kind < STEP_KIND_COUNT ? step_names[kind] : "?"; }

ncclResult_t schedule_push(struct schedule *s, int kind, int flags, size_t src, size_t dst, size_t n) {
  return schedule_push_peer(s, kind, flags, 0, 0, src, dst, n);
}

ncclResult_t schedule_push_peer(struct schedule *s, int kind, int flags, int si, int ri, size_t src, size_t dst,
                                size_t n) {
  if (n == 0)
    return ncclSuccess; /* both ends of a connection skip the same empty chunks */
  if (s->nsteps == s->cap) {
    int cap = s->cap ? s->cap * 2 : 16;
    struct step *ns = realloc(s->steps, sizeof *ns * cap);
    if (!ns)
      return err_set(ncclSystemError, "out of memory for a schedule of %d steps", cap);
    s->steps = ns;
    s->cap = cap;
  }
  s->steps[s->nsteps++] = (struct step){.kind = (uint8_t)kind, .flags = (uint8_t)flags, .si = (uint8_t)si,
                                         .ri = (uint8_t)ri, .src_off = src, .dst_off = dst, .nelem = n};
  return ncclSuccess;
}

void schedule_free(struct schedule *s) {
  free(s->steps);
  memset(s, 0, sizeof *s);
}

void schedule_channel_range(size_t total, int c, int nchannels, size_t align, size_t *off, size_t *len) {
  size_t per = LOOM_ALIGN_UP(LOOM_DIV_UP(total, (size_t)nchannels), align);
  size_t o = per * (size_t)c;
  *off = o < total ? o : total;
  *len = o < total ? LOOM_MIN(per, total - o) : 0;
}

/* Point to point: the whole message is one step, cut into slots by the
 * executor like any other. */
ncclResult_t p2p_schedule(int coll, size_t count, struct schedule *out) {
  out->nsteps = 0; /* keeps the steps buffer of an earlier schedule */
  return schedule_push(out, coll == COLL_SEND ? STEP_SEND : STEP_RECV, 0, 0, 0, count);
}
