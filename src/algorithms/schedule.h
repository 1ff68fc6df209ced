/*
 * A schedule: what one rank does for one collective on one channel, as a
 * sequence of steps over chunks of the buffers. The executor walks it; each
 * step moves its elements through the channel's FIFOs one slot at a time.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_SCHEDULE_H
#define LOOM_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

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

/* The builders (ring_schedule, tree_schedule, rd_schedule,
 * p2p_schedule) take a zeroed schedule or one they filled before, whose
 * steps buffer they reuse: a communicator's works keep theirs from call
 * to call. */
struct schedule {
  int nsteps, cap;
  struct step *steps;
};

/* The CUDA kernel walks the same steps. */
#ifdef __CUDACC__
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

LOOM_HOST_DEVICE static inline int step_recvs(int kind) {
  return kind == STEP_RECV || kind == STEP_RECV_COPY_SEND || kind == STEP_RECV_REDUCE_SEND ||
         kind == STEP_RECV_REDUCE_COPY || kind == STEP_RECV_REDUCE_COPY_SEND;
}
LOOM_HOST_DEVICE static inline int step_sends(int kind) {
  return kind == STEP_SEND || kind == STEP_COPY_SEND || kind == STEP_RECV_COPY_SEND ||
         kind == STEP_RECV_REDUCE_SEND || kind == STEP_RECV_REDUCE_COPY_SEND;
}
const char *step_name(int kind);

/* What a ring schedule is built from. */
struct ring_args {
  int coll;            /* enum coll_kind */
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
ncclResult_t p2p_schedule(int coll, size_t count, struct schedule *out);

/* The elements of `total` that channel `c` of `nchannels` handles. */
void schedule_channel_range(size_t total, int c, int nchannels, size_t align, size_t *off, size_t *len);

/* Appends a step with peer 0 on both sides; empty steps are dropped. */
ncclResult_t schedule_push(struct schedule *s, int kind, int flags, size_t src, size_t dst, size_t n);
/* The same with the step's send and receive peer indices. */
ncclResult_t schedule_push_peer(struct schedule *s, int kind, int flags, int si, int ri, size_t src, size_t dst,
                                size_t n);
void schedule_free(struct schedule *s);

#endif
