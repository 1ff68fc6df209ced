/*
 * Tasks: the calls a thread made, queued until its group ends, and the
 * launch that turns them into schedules and runs them.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_ENQUEUE_H
#define LOOM_ENQUEUE_H

#include "comm/comm.h"
#include "common/coll.h"

/* Runs the tasks queued on these communicators (the end of a group). */
ncclResult_t enqueue_launch(struct ncclComm **comms, int ncomms);

/* A host collective called outside a group, with nothing else queued:
 * runs it at once where its work is one lane's (*handled = 1), and
 * leaves it to the group path otherwise (*handled = 0). */
ncclResult_t enqueue_single(struct ncclComm *comm, struct task *t, int *handled);

#endif
