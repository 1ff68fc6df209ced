/*
 * Planning: a communicator's queued tasks become works on lanes
 * (plan.c); enqueue.c runs them.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include "comm/comm.h"
#include "common/coll.h"
#include "common/dtype.h"

#include <stdint.h>

/* Per communicator: lanes [0, nchannels) are the rings, then one send and
 * one receive lane per peer. */
struct comm_plan {
  struct ncclComm *comm;
  struct lane *lanes;
  int nlanes;
};

/* How many freed works keep their call's shape for enqueue_single. */
#define PLAN_KEPT_SHAPES 4

/* Queues w at the end of lane l. */
void plan_lane_push(struct lane *l, struct work *w);

/* Gives w back to its communicator for reuse. */
void plan_work_free(struct work *w);

/* Makes the works of every task queued on p->comm (lanes from the
 * communicator's own array), after checking its group's streams and
 * copying its sends to itself. */
ncclResult_t plan_comm(struct comm_plan *p);

/* Creates (not yet connected) the connections of every collective
 * algorithm: the first collective does it, a CUDA communicator's init
 * earlier (init.c says why). */
ncclResult_t plan_connect_collectives(struct ncclComm *comm);

/* No buffer can be larger: 2^57 bytes is above the user address space of
 * every platform (x86-64 with 5-level paging has 2^56, arm64 at most
 * 2^52). Addresses themselves are only checked for wrapping around: a
 * pointer may carry a tag in its top bits (arm64 TBI and MTE, x86 LAM). */
#define PLAN_MAX_BUFFER_BYTES ((uint64_t)1 << 57)

static inline int plan_gathered(const struct task *t) {
  return t->coll == COLL_ALLGATHER || t->coll == COLL_REDUCESCATTER;
}

/* The sentence for a call plan_check_size turns back, or success where a
 * buffer it doubted is one the call ignores (a non-root's). */
ncclResult_t plan_refuse_size(const struct ncclComm *comm, const struct task *t, const char *func)
    __attribute__((cold));

/* Refuses, with ncclInvalidArgument and a sentence naming the count and
 * why, a call whose buffers could not exist: count times the type size
 * (times nranks for the gathered or scattered side) overflowing size_t,
 * more than PLAN_MAX_BUFFER_BYTES, or a buffer range that wraps around
 * the end of the address space. Called with the argument checks (after the datatype's), so
 * that everything the planner and executors compute from a count fits in
 * 64 bits. func names the API call. Inline: every call passes here, and a
 * valid one costs two multiplications and a few comparisons. */
static inline ncclResult_t plan_check_size(const struct ncclComm *comm, const struct task *t, const char *func) {
  size_t esize = dtype_size(t->dtype), all;
  if (t->count == 0 || esize == 0)
    return ncclSuccess; /* nothing is read or written; a bad datatype has its own sentence */
  if (__builtin_mul_overflow(t->count, esize * (plan_gathered(t) ? (size_t)comm->nranks : 1), &all) ||
      all > PLAN_MAX_BUFFER_BYTES || (uintptr_t)t->sendbuff > UINTPTR_MAX - all ||
      (uintptr_t)t->recvbuff > UINTPTR_MAX - all)
    return plan_refuse_size(comm, t, func);
  return ncclSuccess;
}

/* The tuner's algorithm and channel count for a collective, by the size
 * of its largest buffer. */
ncclResult_t plan_pick_algo(struct ncclComm *comm, const struct task *t, int *algo, int *nch);

/* Whether the call's buffers lie in windows registered with
 * NCCL_WIN_COLL_SYMMETRIC that every rank maps, on a communicator with
 * an arena: an AllReduce then runs flat, in place in the ranks' buffers,
 * at every size. Registering them so is every rank's promise to pass
 * such buffers to the same call (NCCL's symmetric memory). */
int plan_symmetric(const struct ncclComm *comm, const struct task *t);

/* The cost model's time for task t alone, in seconds: the tuner's
 * estimate for the algorithm it picks, or one message's latency and
 * bandwidth for a Send or Recv (ncclGroupSimulateEnd). */
ncclResult_t plan_estimate(struct ncclComm *comm, const struct task *t, double *seconds);

/* The works of collective t, number seq, by algorithm algo on nch
 * channels. */
ncclResult_t plan_algo(struct comm_plan *p, struct task *t, uint64_t seq, int algo, int nch);

/* Frees the works still queued on n plans and clears their lanes. */
void plan_free(struct comm_plan *plans, int n);

#endif
