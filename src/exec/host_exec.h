/*
 * The host executor: walks a schedule's steps on the calling thread,
 * moving one FIFO slot at a time and never blocking, so that one thread can
 * drive every operation of a group (all channels, all peers, several
 * communicators) and a wait can be bounded and explained.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_HOST_EXEC_H
#define LOOM_HOST_EXEC_H

#include <stdint.h>

#include "exec/copy.h"
#include "exec/sched.h"
#include "common/coll.h"

struct conn;

struct work {
  struct task *task;
  struct ncclComm *comm;
  int channel;
  struct schedule sched;
  /* The connections the steps name by index (step.si, step.ri). */
  int nsends, nrecvs;
  struct conn *sends[WORK_MAX_PEERS], *recvs[WORK_MAX_PEERS];
  const char *src;
  char *dst;
  size_t esize;
  size_t piece;      /* elements per slot */
  int proto;         /* enum loom_proto; LL only on CUDA communicators (their kernel) */
  uint64_t step;     /* index of the current step (sched_at) */
  uint64_t step_off; /* elements of the current step already moved */
  /* Step cur_at expanded, so that polling a blocked step, or running a
   * small call's one step again, does not expand it again; UINT64_MAX
   * for none. Whatever builds a schedule into a work resets it (new_work
   * in plan.c); a call that reuses a work's schedule keeps it. */
  uint64_t cur_at;
  struct step cur;
  uint64_t seq;      /* the collective's number on its communicator */
  /* A flat collective (exec/flat.h) runs on the host's arena instead of
   * steps; where it is, round by round. */
  struct {
    int on;
    int whole;          /* every rank reduces the whole buffer after one barrier */
    int state;          /* enum flat_state (flat.c) */
    uint64_t round, nrounds;
    uint64_t per_round; /* elements of a round */
    uint64_t use, bar;  /* the arena round and barrier it is at */
    uint64_t use0;      /* round 0's, whose call header says where the buffers are */
    /* This rank's buffers lie in a window every rank maps: the others
     * read its input there, write its output there. */
    int src_direct, dst_direct;
    int regions_out;    /* another rank reads results from the regions: write them there */
    int by_cpu;         /* by CPU (shm_arena.h's arena_cpu) rather than by slices */
    uint64_t cpu_round; /* by CPU: the arena's round by CPU that this round is */
  } flat;
  struct work *next;
  /* What the schedule was built for, when enqueue_single may reuse it
   * (coll + 1; 0: not reusable). */
  struct {
    int coll, dtype, root;
    int symmetric; /* plan_symmetric: the buffers chose the algorithm */
    int wins;      /* windows every rank maps existed: a flat call went by slices, not by CPU (plan_flat) */
    size_t count;
  } key;
};

/* Works that share connections run in call order on one lane; lanes run
 * concurrently (host: one thread drives them all; CUDA: a block each). */
struct lane {
  struct work *head, *tail;
};

/* A work taken back for a call of the same shape starts again from its
 * first step or round. */
static inline void exec_rewind(struct work *w) {
  w->step = 0;
  w->step_off = 0;
  w->flat.state = 0;
  w->flat.round = 0;
}

/* Whether the call is large enough that outputs it has not read go by
 * streaming stores (copy.h, COPY_STREAM_MIN): the flat AllReduce's and
 * the schedules' last copies into the output, and the ring's final
 * reduction. */
static inline int exec_streams(const struct work *w) { return w->task->count * w->esize >= COPY_STREAM_MIN; }

/* Whether the output of such a call is written by streaming stores where
 * it is written last: out of place only, since in place its lines were
 * read as the input and ordinary stores find them in the cache. */
static inline int exec_streams_out(const struct work *w) { return exec_streams(w) && w->src != w->dst; }

/* Moves what can be moved now. *moved tells whether anything did; *done
 * whether the work has finished all its steps (net sends may still be
 * leaving: see exec_flushed). */
ncclResult_t exec_progress(struct work *w, int *moved, int *done);

/* Whether everything this work posted has left the process. */
int exec_flushed(const struct work *w);

/* The connections the work is blocked on now (at most WORK_MAX_PEERS):
 * only their peers' deaths matter, since a peer that finished its part
 * and exited has done nothing wrong. */
int exec_waiting_on(const struct work *w, struct conn **out);

/* Where the work's thread may sleep until a peer moves a FIFO counter:
 * the counter, the value it has while the work is blocked, and its
 * sleeper count. 0 where the work waits on something it cannot sleep on
 * (its own network progress, a GPU) or is not blocked on one FIFO. */
int exec_sleep_target(const struct work *w, _Atomic uint64_t **counter, uint64_t *seen, _Atomic uint32_t **sleepers);

/* The rank the work waits for where no connection names it (a flat
 * collective's barrier), else -1. */
int exec_waiting_rank(const struct work *w);

/* While nothing moves: the error of a rank the work waits for without a
 * connection (a flat collective's barrier) that failed or exited, or of
 * a call of another rank's that crossed this one in the host's arena. */
ncclResult_t exec_check_waiting(const struct work *w);

/* A sentence fragment saying what the work waits for, for timeouts. */
void exec_describe_wait(const struct work *w, char *buf, size_t len);

#endif
