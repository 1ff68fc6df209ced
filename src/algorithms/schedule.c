/* Schedules: storage, and the pieces every algorithm shares.
 * SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "algorithms/schedule.h"
#include "common/coll.h"

#include <stdlib.h>
#include <string.h>

void schedule_clear(struct schedule *s) {
  s->nsteps = 0;
  s->nloops = s->ntmpl = 0;
}

static ncclResult_t add_loop(struct schedule *s, size_t start, size_t stride, size_t chunk, size_t end, size_t count,
                             uint32_t first, uint32_t ntmpl) {
  if (s->nloops == SCHED_MAX_LOOPS)
    return err_set(ncclInternalError, "a schedule of more than %d loops", SCHED_MAX_LOOPS);
  s->loops[s->nloops++] = (struct sched_loop){
      .start = start, .stride = stride, .chunk = chunk, .end = end, .count = count, .first = first, .ntmpl = ntmpl};
  return ncclSuccess;
}

ncclResult_t schedule_loop(struct schedule *s, size_t start, size_t stride, size_t chunk, size_t end, size_t count) {
  return add_loop(s, start, stride, chunk, end, count, s->ntmpl, 0);
}

ncclResult_t schedule_loop_again(struct schedule *s, size_t start, size_t stride, size_t chunk, size_t end,
                                 size_t count) {
  if (s->nloops == 0)
    return err_set(ncclInternalError, "a schedule loop repeats templates that no loop has");
  const struct sched_loop *prev = &s->loops[s->nloops - 1];
  return add_loop(s, start, stride, chunk, end, count, prev->first, prev->ntmpl);
}

ncclResult_t schedule_tmpl(struct schedule *s, int kind, int flags, int si, int ri, int chunk, int rel, size_t src,
                           size_t dst) {
  const struct sched_loop *cur = &s->loops[s->nloops ? s->nloops - 1 : 0];
  if (s->nloops == 0 || cur->first + cur->ntmpl != s->ntmpl || (s->nloops > 1 && cur[-1].first == cur->first))
    return err_set(ncclInternalError, "a schedule template outside a loop of its own");
  if (s->ntmpl == s->cap) {
    /* Templates grow with the ranks, never with the count. */
    uint32_t cap = s->cap ? s->cap * 2 : 16;
    if (cap <= s->cap) /* 2^31 templates: ranks an int cannot count */
      return err_set(ncclInternalError, "a schedule of more than %u step templates", s->cap);
    struct step_tmpl *nt = realloc(s->tmpl, sizeof *nt * (size_t)cap);
    if (!nt)
      return err_set(ncclSystemError, "out of memory for a schedule of %u step templates", cap);
    s->tmpl = nt;
    s->cap = cap;
  }
  s->tmpl[s->ntmpl++] = (struct step_tmpl){.kind = (uint8_t)kind, .flags = (uint8_t)flags, .si = (uint8_t)si,
                                           .ri = (uint8_t)ri, .rel = (uint8_t)rel, .chunk = (uint32_t)chunk,
                                           .src_off = src, .dst_off = dst};
  s->loops[s->nloops - 1].ntmpl++;
  return ncclSuccess;
}

/* Whether a loop keeps sched_at's arithmetic within 64 bits, and the
 * promises schedule_slots relies on: no iteration is wholly past the end,
 * and iterations do not overlap (so only the last can be clipped). */
static ncclResult_t check_loop(const struct schedule *s, uint32_t l) {
  const struct sched_loop *lp = &s->loops[l];
  if (lp->ntmpl == 0 || lp->count == 0 || lp->chunk == 0)
    return err_set(ncclInternalError, "schedule loop %u has %u templates, %llu iterations, chunks of %llu", l,
                   lp->ntmpl, (unsigned long long)lp->count, (unsigned long long)lp->chunk);
  uint64_t maxc = 0, span, last, top;
  for (uint32_t t = lp->first; t < lp->first + lp->ntmpl; t++)
    maxc = LOOM_MAX(maxc, (uint64_t)s->tmpl[t].chunk);
  int bad = __builtin_mul_overflow(maxc + 1, lp->chunk, &span) ||
            __builtin_mul_overflow(lp->count - 1, lp->stride, &last) ||
            __builtin_add_overflow(last, lp->start, &last) || __builtin_add_overflow(lp->end, span, &top) ||
            last >= lp->end || (lp->count > 1 && lp->stride < span);
  for (uint32_t t = lp->first; t < lp->first + lp->ntmpl && !bad; t++) {
    uint64_t x;
    bad = __builtin_add_overflow(s->tmpl[t].src_off, lp->end, &x) ||
          __builtin_add_overflow(s->tmpl[t].dst_off, lp->end, &x);
  }
  if (bad)
    return err_set(ncclInternalError,
                   "schedule loop %u (start %llu, stride %llu, chunk %llu, end %llu, %llu iterations) does not fit "
                   "in 64 bits or overlaps itself",
                   l, (unsigned long long)lp->start, (unsigned long long)lp->stride, (unsigned long long)lp->chunk,
                   (unsigned long long)lp->end, (unsigned long long)lp->count);
  return ncclSuccess;
}

ncclResult_t schedule_finish(struct schedule *s, ncclResult_t built) {
  if (built != ncclSuccess) {
    schedule_clear(s);
    return built;
  }
  uint64_t n = 0;
  for (uint32_t l = 0; l < s->nloops; l++) {
    struct sched_loop *lp = &s->loops[l];
    uint64_t steps;
    ncclResult_t r = check_loop(s, l);
    if (r == ncclSuccess && (__builtin_mul_overflow(lp->count, (uint64_t)lp->ntmpl, &steps) ||
                             __builtin_add_overflow(n, steps, &steps)))
      r = err_set(ncclInternalError, "a schedule of more than 2^64 steps");
    if (r != ncclSuccess) {
      schedule_clear(s);
      return r;
    }
    lp->first_step = n;
    n = steps;
  }
  s->nsteps = n;
  return ncclSuccess;
}

void schedule_channel_range(size_t total, int c, int nchannels, size_t align, size_t *off, size_t *len) {
  /* Written so that no count the size_t can hold overflows it. */
  size_t per = total / (size_t)nchannels + (total % (size_t)nchannels != 0), o;
  if (per % align && per <= SIZE_MAX - align)
    per += align - per % align;
  if (__builtin_mul_overflow(per, (size_t)c, &o))
    o = total;
  *off = o < total ? o : total;
  *len = o < total ? LOOM_MIN(per, total - o) : 0;
}

/* Point to point: the whole message is one step, cut into slots by the
 * executor like any other. */
ncclResult_t p2p_schedule(enum coll_kind coll, size_t count, struct schedule *out) {
  schedule_clear(out); /* keeps the template buffer of an earlier schedule */
  if (count == 0)
    return ncclSuccess;
  ncclResult_t r = schedule_loop(out, 0, count, count, count, 1);
  if (r == ncclSuccess)
    r = schedule_tmpl(out, coll == COLL_SEND ? STEP_SEND : STEP_RECV, 0, 0, 0, 0, TMPL_REL_SRC | TMPL_REL_DST, 0, 0);
  return schedule_finish(out, r);
}
