/*
 * Tasks: the calls a thread made, queued until its group ends, and the
 * launch that turns them into schedules and runs them.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_ENQUEUE_H
#define LOOM_ENQUEUE_H

#include "comm.h"
#include "exec/reduce.h"

enum coll_kind {
  COLL_BROADCAST = 0,
  COLL_REDUCE = 1,
  COLL_ALLGATHER = 2,
  COLL_REDUCESCATTER = 3,
  COLL_ALLREDUCE = 4,
  COLL_SEND = 5,
  COLL_RECV = 6,
  COLL_COUNT
};

const char *coll_name(int coll);

struct task {
  int coll;
  const void *sendbuff;
  void *recvbuff;
  size_t count;    /* as the API call's count argument */
  int dtype;
  int op;          /* ncclRedOp_t as given */
  int root;        /* Broadcast, Reduce */
  int peer;        /* Send, Recv */
  void *stream;    /* cudaStream_t of a CUDA communicator's call */
  struct red_op red;
  const void *scalar_dev; /* PreMulSum scalar the kernel reads (device residence) */
  int call_check;         /* the all-gather of LOOM_CHECK_CALLS, not a user's call */
  struct task *next;
};

/* Runs the tasks queued on these communicators (the end of a group). */
ncclResult_t enqueue_launch(struct ncclComm **comms, int ncomms);

/* A host collective called outside a group, with nothing else queued:
 * runs it at once where its work is one lane's (*handled = 1), and
 * leaves it to the group path otherwise (*handled = 0). */
ncclResult_t enqueue_single(struct ncclComm *comm, struct task *t, int *handled);

/* Describes a task in a sentence fragment, for error messages. */
void task_describe(const struct task *t, char *buf, size_t len);

#endif
