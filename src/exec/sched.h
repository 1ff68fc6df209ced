/*
 * A schedule: what one rank does for one collective on one channel, as a
 * sequence of steps over chunks of the buffers. The executor walks it; each
 * step moves its elements through the channel's FIFOs one slot at a time.
 * This is the form the executors run, so it lives on their floor; the
 * algorithms build it (algorithms/schedule.h).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_SCHED_H
#define LOOM_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "core.h" /* LOOM_HOST_DEVICE */

enum step_kind {
  STEP_SEND = 0,                  /* input -> next */
  STEP_RECV = 1,                  /* prev -> output */
  STEP_COPY_SEND = 2,             /* input -> output and next */
  STEP_RECV_COPY_SEND = 3,        /* prev -> output and next */
  STEP_RECV_REDUCE_SEND = 4,      /* prev (+) input -> next */
  STEP_RECV_REDUCE_COPY = 5,      /* prev (+) input -> output */
  STEP_RECV_REDUCE_COPY_SEND = 6, /* prev (+) input -> output and next */
  STEP_COPY = 7,                  /* input -> output, no peer */
  STEP_KIND_COUNT
};

/* The step produces the final reduced value (integer Avg divides here). */
#define STEP_FINAL 0x1
/* The step's local input is the receive buffer (a partial result made by
 * an earlier step), not the send buffer. */
#define STEP_SRC_DST 0x2
/* The local input is a partial result: PreMulSum's scalar was applied to
 * it already. */
#define STEP_NO_PREMUL 0x4

/* Peers a work talks to: a ring's next and previous rank, a tree's parent
 * and children, recursive doubling's partners. */
#define WORK_MAX_PEERS 12

/* A step as the executors see it. */
struct step {
  uint8_t kind;
  uint8_t flags;
  uint8_t si, ri; /* which of the work's send / receive peers */
  uint32_t pad;
  uint64_t src_off; /* elements into the send buffer */
  uint64_t dst_off; /* elements into the receive buffer */
  uint64_t nelem;
};

/* The peers of a schedule, by index: send[i] and recv[i] are ranks. */
struct sched_peers {
  int nsend, nrecv;
  int send[WORK_MAX_PEERS], recv[WORK_MAX_PEERS];
};

/* A schedule is stored as loops over chunks, never as its expanded steps,
 * so that its size depends on the ranks and the algorithm but not on the
 * count: a 2^57-byte AllReduce is planned in the memory of a small one.
 * Loop l runs `count` iterations; iteration i owns the chunks starting at
 * start + i*stride, `chunk` elements each, clipped to `end`; for every
 * iteration its templates [first, first + ntmpl) give one step each, in
 * order. Steps that clipping leaves empty are skipped by every executor
 * (both ends of a connection skip the same ones). */
struct sched_loop {
  uint64_t start, stride, chunk, end, count;
  uint64_t first_step; /* index of the loop's first step in the schedule */
  uint32_t first, ntmpl;
};

/* Offsets of a template that count from its chunk's start; the others
 * are absolute (a receive's unused input, say). */
#define TMPL_REL_SRC 0x1
#define TMPL_REL_DST 0x2

struct step_tmpl {
  uint8_t kind, flags, si, ri;
  uint8_t rel;     /* TMPL_REL_* */
  uint8_t pad[3];
  uint32_t chunk;  /* which chunk of the iteration */
  uint32_t pad2;
  uint64_t src_off, dst_off;
};

/* At most this many loops: a ring AllReduce's full loops and its last
 * one, a tree's way up and way down. */
#define SCHED_MAX_LOOPS 4

/* The builders (ring_schedule, tree_schedule, rd_schedule,
 * p2p_schedule) take a zeroed schedule or one they filled before, whose
 * template buffer they reuse: a communicator's works keep theirs from
 * call to call. The CUDA executor copies the whole structure into its
 * launch, with `tmpl` pointing at a device copy of the templates. */
struct schedule {
  uint64_t nsteps; /* steps, empty ones included: sched_at's range */
  uint32_t nloops, ntmpl, cap;
  uint32_t pad;
  struct sched_loop loops[SCHED_MAX_LOOPS];
  struct step_tmpl *tmpl;
};

/* The GPU kernel walks the same steps (LOOM_HOST_DEVICE). */
/* Step k (< s->nsteps) of a schedule; its nelem is 0 where the step is
 * one to skip. The host executor and the CUDA kernel both expand steps
 * with this, one at a time, as they reach them. schedule_finish checked
 * that none of this arithmetic can overflow. */
LOOM_HOST_DEVICE static inline void sched_at(const struct schedule *s, uint64_t k, struct step *out) {
  uint32_t l = 0;
  while (l + 1 < s->nloops && k >= s->loops[l + 1].first_step)
    l++;
  const struct sched_loop *lp = &s->loops[l];
  uint64_t i = k - lp->first_step, it = i < lp->ntmpl ? 0 : i / lp->ntmpl; /* small calls: no division */
  const struct step_tmpl *t = &s->tmpl[lp->first + (uint32_t)(i - it * lp->ntmpl)];
  uint64_t lo = lp->start + it * lp->stride + (uint64_t)t->chunk * lp->chunk, hi = lo + lp->chunk;
  lo = lo < lp->end ? lo : lp->end;
  hi = hi < lp->end ? hi : lp->end;
  out->kind = t->kind;
  out->flags = t->flags;
  out->si = t->si;
  out->ri = t->ri;
  out->pad = 0;
  out->src_off = t->src_off + ((t->rel & TMPL_REL_SRC) ? lo : 0);
  out->dst_off = t->dst_off + ((t->rel & TMPL_REL_DST) ? lo : 0);
  out->nelem = hi - lo;
}

LOOM_HOST_DEVICE static inline int step_recvs(int kind) {
  return kind == STEP_RECV || kind == STEP_RECV_COPY_SEND || kind == STEP_RECV_REDUCE_SEND ||
         kind == STEP_RECV_REDUCE_COPY || kind == STEP_RECV_REDUCE_COPY_SEND;
}
LOOM_HOST_DEVICE static inline int step_sends(int kind) {
  return kind == STEP_SEND || kind == STEP_COPY_SEND || kind == STEP_RECV_COPY_SEND ||
         kind == STEP_RECV_REDUCE_SEND || kind == STEP_RECV_REDUCE_COPY_SEND;
}

/* "recv-reduce-send" and so on, for messages. */
const char *step_name(int kind);

/* The FIFO slots of `piece` elements each that the whole schedule moves
 * on each of its send and receive peers (WORK_MAX_PEERS entries each,
 * added to), computed from the loops without expanding them. */
void schedule_slots(const struct schedule *s, uint64_t piece, uint64_t *sends, uint64_t *recvs);

void schedule_free(struct schedule *s);

#endif
