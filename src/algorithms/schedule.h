/*
 * Building schedules (exec/sched.h has their form): the ring, tree,
 * recursive-doubling and point-to-point builders, and the pieces they
 * share.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_SCHEDULE_H
#define LOOM_SCHEDULE_H

#include <stddef.h>

#include "nccl.h"
#include "common/coll.h"
#include "exec/sched.h"

/* What a ring schedule is built from. */
struct ring_args {
  enum coll_kind coll;
  int nranks;
  const int *ring;     /* ranks in ring order */
  int index;           /* this rank's position in `ring` */
  int root;            /* Broadcast/Reduce root rank */
  size_t count;        /* the call's count argument */
  size_t off, len;     /* this channel's elements: of the buffer (AllReduce,
                          Broadcast, Reduce) or of each rank's block */
  size_t chunk;        /* elements per pipelined chunk */
  size_t align;        /* chunk boundaries fall on multiples of this */
};

ncclResult_t ring_schedule(const struct ring_args *a, struct schedule *out);

/* AllReduce by recursive doubling, for small buffers: log2(p) exchanges
 * of the whole buffer with partner rank ^ 2^k among the first p (a power
 * of two) ranks; ranks p..n-1 first fold their input into rank - p and get
 * the result back at the end. Each exchange sends before it receives, so
 * the buffer must fit in a connection's FIFO (the tuner sees to it). */
ncclResult_t rd_schedule(int rank, int nranks, size_t count, struct schedule *out, struct sched_peers *peers);

/* AllReduce on a tree over [off, off + len) in chunks: every chunk is
 * reduced up to the root (children first, then the parent), then every
 * chunk is broadcast back down. parent -1 at the root. */
ncclResult_t tree_schedule(int parent, const int *children, int nchildren, size_t off, size_t len, size_t chunk,
                           struct schedule *out, struct sched_peers *peers);

/* Send or receive `count` elements with a peer: one step. */
ncclResult_t p2p_schedule(enum coll_kind coll, size_t count, struct schedule *out);

/* The elements of `total` that channel `c` of `nchannels` handles. */
void schedule_channel_range(size_t total, int c, int nchannels, size_t align, size_t *off, size_t *len);

/* Building a schedule: schedule_clear; per loop, schedule_loop (or
 * schedule_loop_again, which repeats the previous loop's templates over
 * other bounds) and then its templates, in step order (schedule_tmpl);
 * last, schedule_finish with the result of those calls, which checks the
 * loops and sets nsteps, or passes a failure on. A failure leaves the
 * schedule empty. */
void schedule_clear(struct schedule *s);
ncclResult_t schedule_loop(struct schedule *s, size_t start, size_t stride, size_t chunk, size_t end, size_t count);
ncclResult_t schedule_loop_again(struct schedule *s, size_t start, size_t stride, size_t chunk, size_t end,
                                 size_t count);
/* A step of every iteration of the current loop, over chunk `chunk` of
 * the iteration; `rel` (TMPL_REL_*) says which of src and dst count from
 * the chunk's start. */
ncclResult_t schedule_tmpl(struct schedule *s, int kind, int flags, int si, int ri, int chunk, int rel, size_t src,
                           size_t dst);
ncclResult_t schedule_finish(struct schedule *s, ncclResult_t built);

#endif
