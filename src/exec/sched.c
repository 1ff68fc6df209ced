/* The names of the steps (exec/sched.h). SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "exec/sched.h"

#include <stdlib.h>
#include <string.h>

static const char *step_names[STEP_KIND_COUNT] = {
    "send", "recv", "copy-send", "recv-copy-send", "recv-reduce-send", "recv-reduce-copy",
    "recv-reduce-copy-send", "copy",
};

const char *step_name(int kind) { return kind >= 0 && kind < STEP_KIND_COUNT ? step_names[kind] : "?"; }

static uint64_t slots_of(uint64_t nelem, uint64_t piece) { return nelem / piece + (nelem % piece != 0); }

void schedule_slots(const struct schedule *s, uint64_t piece, uint64_t *sends, uint64_t *recvs) {
  for (uint32_t l = 0; l < s->nloops; l++) {
    const struct sched_loop *lp = &s->loops[l];
    uint64_t maxc = 0;
    for (uint32_t t = lp->first; t < lp->first + lp->ntmpl; t++)
      maxc = LOOM_MAX(maxc, (uint64_t)s->tmpl[t].chunk);
    /* Iterations that clipping leaves whole come first and are alike;
     * check_loop saw to it that at most the last one is not. */
    uint64_t span = (maxc + 1) * lp->chunk, room = lp->end - lp->start, whole = 0;
    if (room >= span)
      whole = lp->stride ? LOOM_MIN(lp->count, (room - span) / lp->stride + 1) : lp->count;
    for (uint32_t t = lp->first; t < lp->first + lp->ntmpl; t++) {
      const struct step_tmpl *tp = &s->tmpl[t];
      uint64_t n = whole * slots_of(lp->chunk, piece);
      if (step_sends(tp->kind))
        sends[tp->si] += n;
      if (step_recvs(tp->kind))
        recvs[tp->ri] += n;
    }
    for (uint64_t it = whole; it < lp->count; it++)
      for (uint32_t t = 0; t < lp->ntmpl; t++) {
        struct step st;
        sched_at(s, lp->first_step + it * lp->ntmpl + t, &st);
        if (step_sends(st.kind))
          sends[st.si] += slots_of(st.nelem, piece);
        if (step_recvs(st.kind))
          recvs[st.ri] += slots_of(st.nelem, piece);
      }
  }
}

void schedule_free(struct schedule *s) {
  free(s->tmpl);
  memset(s, 0, sizeof *s);
}
