/*
 * Nonblocking communicators (ncclConfig_t.blocking = 0): their creation
 * and their launches run on a worker thread of the communicator, and the
 * call returns ncclInProgress at once. ncclCommGetAsyncError says
 * ncclInProgress until the job is done, then its result. As NCCL
 * documents, one job at a time: a call made before the last one is done
 * is refused with a sentence saying so.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_ASYNC_H
#define LOOM_ASYNC_H

#include "core.h"

struct ncclComm;
struct async_worker;

/* The job runs on `owner`'s worker with `arg`; `comms` (which include
 * `owner`) are busy until it is done. The caller has entered each of them
 * (comm_enter): the worker leaves them when the job is done, so that
 * ncclCommAbort from another thread waits for the job. On a failure to
 * start, nothing has changed and the sentence is recorded. */
typedef void (*async_fn)(void *arg);
ncclResult_t async_submit(struct ncclComm *owner, struct ncclComm **comms, int ncomms, async_fn fn, void *arg);

/* Waits until the communicator's job is done (ncclCommDestroy). */
void async_wait(const struct ncclComm *comm);

/* Stops and joins the communicator's worker, if it has one; the last
 * thing done to a communicator before its memory goes. */
void async_stop(struct ncclComm *comm);

#endif
