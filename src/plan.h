/*
 * Planning: a communicator's queued tasks become works on lanes
 * (plan.c); enqueue.c runs them.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include "comm.h"
#include "enqueue.h"

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

/* The tuner's algorithm and channel count for a collective, by the size
 * of its largest buffer. */
ncclResult_t plan_pick_algo(struct ncclComm *comm, const struct task *t, int *algo, int *nch);

/* The works of collective t, number seq, by algorithm algo on nch
 * channels. */
ncclResult_t plan_algo(struct comm_plan *p, struct task *t, uint64_t seq, int algo, int nch);

/* Frees the works still queued on n plans and clears their lanes. */
void plan_free(struct comm_plan *plans, int n);

#endif
