/*
 * The vocabulary of a call, which every layer speaks: the kinds of
 * collective, their names, one queued call (a task) and its description
 * in a sentence fragment. The API floor makes tasks (enqueue.c); the
 * algorithms, the executors, the call check and the status page read
 * them, so the words live here, on the ground floor, and none of those
 * imports the orchestrator to say "AllReduce".
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_COLL_H
#define LOOM_COLL_H

#include <stddef.h>

#include "common/red_op.h"

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

/* "AllReduce" and so on; "?" for a value that is no kind. */
const char *coll_name(enum coll_kind coll);

/* The collectives made of point-to-point operations, one Send and one
 * Recv per peer in one group: a task of theirs is a Send or Recv that
 * says which call it belongs to, in sentences. */
enum coll_via { VIA_NONE = 0, VIA_ALLTOALL, VIA_GATHER, VIA_SCATTER, VIA_ALLTOALLV };
const char *coll_via_name(enum coll_via via);

struct task {
  enum coll_kind coll;
  const void *sendbuff;
  void *recvbuff;
  size_t count;    /* as the API call's count argument */
  int dtype;       /* ncclDataType_t */
  int op;          /* ncclRedOp_t as given */
  int root;        /* Broadcast, Reduce */
  int peer;        /* Send, Recv */
  void *stream;    /* cudaStream_t of a CUDA communicator's call */
  struct red_op red;
  const void *scalar_dev; /* PreMulSum scalar the kernel reads (device residence) */
  int call_check;         /* the all-gather of LOOM_CHECK_CALLS, not a user's call */
  int via;                /* enum coll_via: the call a Send or Recv is part of */
  struct task *next;
};

/* Describes a task in a sentence fragment, for error messages. */
void task_describe(const struct task *t, char *buf, size_t len);

#endif
