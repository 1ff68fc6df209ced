/*
 * Groups: ncclGroupStart/End on this thread. Calls made inside a group are
 * queued and run together at the end; outside a group each call is a group
 * of its own.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_GROUP_H
#define LOOM_GROUP_H

#include "comm_api.h"
#include "common/coll.h"

int group_depth(void);

/* Queues `t` (copied) on `comm`; outside a group it runs at once. */
ncclResult_t group_enqueue(struct ncclComm *comm, struct task *t);

/* Communicator creation inside a group waits for the group's end, where
 * all such jobs run concurrently (one thread may create several ranks). */
struct group_job {
  ncclResult_t (*fn)(struct group_job *job);
  struct ncclComm *comm; /* the communicator it creates, for errors */
  ncclResult_t result;
  struct group_job *next;
};
ncclResult_t group_add_job(struct group_job *job);

/* A call inside the group failed: ncclGroupEnd will report it and run
 * nothing. */
void group_record_error(ncclResult_t res);

#endif
