/*
 * ncclGroupStart and ncclGroupEnd (group.h): the thread's nesting depth,
 * the communicators and creation jobs its open group holds, and the first
 * error of the group, which ncclGroupEnd returns.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "async.h"
#include "enqueue.h"
#include "group.h"
#include "plan.h"
#include "misc/utils.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static LOOM_TLS_FAST int depth;
static LOOM_TLS_FAST struct ncclComm *comms_head;
static LOOM_TLS_FAST struct group_job *jobs_head, *jobs_tail;
static LOOM_TLS_FAST ncclResult_t first_error;
/* On the heap, rarely: see src/misc/errors.c on static TLS. */
static LOOM_TLS_FAST char *first_error_msg;

int group_depth(void) { return depth; }

void group_record_error(ncclResult_t res) {
  if (depth > 0 && first_error == ncclSuccess) {
    first_error = res;
    free(first_error_msg);
    first_error_msg = strdup(err_thread_last());
  }
}

static void free_tasks(struct ncclComm *comm) {
  for (struct task *t = comm->tasks_head, *n; t; t = n) {
    n = t->next;
    if (t != comm->task_inline)
      free(t);
  }
  comm->task_inline_used = 0;
  comm->tasks_head = comm->tasks_tail = NULL;
}

/* Drops a group's queued operations without running them. */
static void discard(struct ncclComm *list) {
  for (struct ncclComm *c = list, *n; c; c = n) {
    n = c->group_next;
    free_tasks(c);
    c->in_group = 0;
    c->group_next = NULL;
  }
}

/* After a launch: its failure recorded on each communicator, its tasks
 * gone. A call the call check refused moved nothing, so a blocking
 * communicator stays usable; a nonblocking one can only report it as its
 * state. */
static void launch_done(struct ncclComm **comms, int n, ncclResult_t r) {
  for (int i = 0; i < n; i++) {
    if (r != ncclSuccess && (!comms[i]->call_refused || !comms[i]->blocking))
      comm_set_error(comms[i], r);
    comms[i]->call_refused = 0;
    free_tasks(comms[i]);
    comms[i]->in_group = 0;
    comms[i]->group_next = NULL;
  }
}

struct launch_job {
  int n;
  struct ncclComm *comms[];
};

static void launch_async(void *arg) {
  struct launch_job *j = arg;
  ncclResult_t r = enqueue_launch(j->comms, j->n);
  launch_done(j->comms, j->n, r);
  api_finish(r == ncclSuccess ? NULL : j->comms[0], r);
  free(j);
}

/* Nonblocking communicators hand the launch to a worker and return
 * ncclInProgress; a group must not mix the two kinds, since its calls
 * would then both return at once and not. */
static ncclResult_t launch_submit(struct ncclComm **comms, int n) {
  int nonblocking = 0;
  for (int i = 0; i < n; i++)
    nonblocking += !comms[i]->blocking;
  if (nonblocking == 0)
    return ncclSuccess;
  if (nonblocking != n)
    return err_set(ncclInvalidUsage,
                   "a group holds operations on %d nonblocking and %d blocking communicators; one group's "
                   "communicators must all be of one kind (ncclConfig_t.blocking)",
                   nonblocking, n - nonblocking);
  struct launch_job *j = malloc(sizeof *j + sizeof *comms * (size_t)n);
  if (!j)
    return err_set(ncclSystemError, "out of memory handing a launch to a nonblocking communicator's worker");
  j->n = n;
  memcpy(j->comms, comms, sizeof *comms * (size_t)n);
  ncclResult_t r = async_submit(comms[0], comms, n, launch_async, j);
  if (r != ncclSuccess) {
    free(j);
    return r;
  }
  return ncclInProgress;
}

/* `api_exit`: whether this is the API's exit (ncclGroupEnd), or a call's
 * that has entered its communicator and says the result itself (logged
 * once, and written to the communicator before it leaves it). */
static ncclResult_t launch(struct ncclComm *list, int api_exit) {
  int n = 0;
  for (struct ncclComm *c = list; c; c = c->group_next)
    n++;
  if (n == 0)
    return ncclSuccess;
  struct ncclComm *few[8], **comms = few;
  if (n > 8) {
    ncclResult_t e = UTIL_CALLOC(&comms, n, "group communicators");
    if (e != ncclSuccess)
      return api_exit ? api_finish(NULL, e) : e;
  }
  n = 0;
  int entered = 0;
  ncclResult_t r = ncclSuccess;
  for (struct ncclComm *c = list; c; c = c->group_next) {
    comms[n++] = c;
    if (r == ncclSuccess && api_exit)
      r = comm_enter(c, "ncclGroupEnd");
    entered += r == ncclSuccess && api_exit;
  }
  if (r != ncclSuccess) {
    /* Another thread is inside a call on one of them: the group runs
     * nothing, and no communicator is marked failed by this refusal. */
    for (int i = 0; i < entered; i++)
      comm_leave(comms[i]);
    discard(list);
    if (comms != few)
      free(comms);
    return api_finish(NULL, r);
  }
  r = launch_submit(comms, n);
  if (r == ncclSuccess)
    r = enqueue_launch(comms, n);
  int rank = log_get_rank();
  if (r != ncclInProgress)
    launch_done(comms, n, r);
  log_set_rank(rank);
  /* The API's exit, before comm_leave: after it, an abort from another
   * thread may free the communicators. A job handed to a worker leaves
   * them when it is done. */
  if (api_exit)
    r = api_finish(r == ncclSuccess ? NULL : comms[0], r);
  for (int i = 0; r != ncclInProgress && i < entered; i++)
    comm_leave(comms[i]);
  if (comms != few)
    free(comms);
  return r;
}

ncclResult_t group_enqueue(struct ncclComm *comm, struct task *t) {
  /* The thread that opened a group launches what it queued; a call from
   * another thread would launch it too, mixed with its own. */
  if (comm->in_group && comm->group_owner != &depth)
    return err_set(ncclInvalidUsage,
                   "nccl%s: the communicator has operations queued in another thread's open group "
                   "(ncclGroupStart); a communicator takes one thread's calls at a time. Nothing was done",
                   coll_name(t->coll));
  if (depth == 0 && !comms_head && !comm->tasks_head && comm->is_host && comm->blocking) {
    int handled;
    ncclResult_t r = enqueue_single(comm, t, &handled);
    if (handled || r != ncclSuccess)
      return r;
  }
  /* The first task of a launch lives in the communicator: a call outside
   * a group allocates nothing. */
  if (!comm->task_inline)
    comm->task_inline = malloc(sizeof *comm->task_inline);
  struct task *copy = comm->task_inline;
  if (comm->task_inline_used || !copy)
    copy = malloc(sizeof *copy);
  else
    comm->task_inline_used = 1;
  if (!copy)
    return err_set(ncclSystemError, "out of memory queueing an operation");
  *copy = *t;
  copy->next = NULL;
  if (comm->tasks_tail)
    comm->tasks_tail->next = copy;
  else
    comm->tasks_head = copy;
  comm->tasks_tail = copy;
  if (!comm->in_group) {
    comm->in_group = 1;
    comm->group_owner = &depth;
    comm->group_next = comms_head;
    comms_head = comm;
  }
  if (depth > 0)
    return ncclSuccess;
  struct ncclComm *list = comms_head;
  comms_head = NULL;
  return launch(list, 0);
}

ncclResult_t group_add_job(struct group_job *job) {
  job->next = NULL;
  if (jobs_tail)
    jobs_tail->next = job;
  else
    jobs_head = job;
  jobs_tail = job;
  return ncclSuccess;
}

static void *job_thread(void *arg) {
  struct group_job *job = arg;
  job->result = job->fn(job);
  if (job->result != ncclSuccess)
    api_finish(job->comm, job->result);
  return NULL;
}

/* Runs the group's communicator creations concurrently and returns the
 * first failure; each job owns its own memory. */
static ncclResult_t run_jobs(struct group_job *list) {
  int n = 0;
  for (struct group_job *j = list; j; j = j->next)
    n++;
  if (n == 0)
    return ncclSuccess;
  pthread_t *threads = calloc(n, sizeof *threads);
  if (!threads)
    return err_set(ncclSystemError, "out of memory starting %d communicator creations", n);
  int i = 0;
  for (struct group_job *j = list; j; j = j->next, i++) {
    int rc = pthread_create(&threads[i], NULL, job_thread, j);
    if (rc != 0) {
      j->result = err_set(ncclSystemError, "cannot start a thread to create a communicator: %s", strerror(rc));
      api_finish(j->comm, j->result);
      threads[i] = 0;
    }
  }
  ncclResult_t first = ncclSuccess;
  i = 0;
  for (struct group_job *j = list, *nx; j; j = nx, i++) {
    nx = j->next;
    if (threads[i])
      pthread_join(threads[i], NULL);
    if (j->result != ncclSuccess && first == ncclSuccess) {
      first = j->result;
      err_set(first, "%s", j->comm ? j->comm->last_error : "communicator creation failed");
    }
    free(j);
  }
  free(threads);
  return first;
}

NCCL_API(ncclResult_t, ncclGroupStart, void) {
  if (depth == 0) {
    first_error = ncclSuccess;
    free(first_error_msg);
    first_error_msg = NULL;
  }
  depth++;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupEnd, void) {
  if (depth == 0)
    return api_finish(NULL, err_set(ncclInvalidUsage, "ncclGroupEnd called without a matching ncclGroupStart"));
  if (--depth > 0)
    return ncclSuccess;
  struct group_job *jobs = jobs_head;
  jobs_head = jobs_tail = NULL;
  struct ncclComm *list = comms_head;
  comms_head = NULL;
  ncclResult_t r = run_jobs(jobs);
  if (r == ncclSuccess && first_error != ncclSuccess)
    r = err_set(first_error, "an operation in this group failed, so the group ran nothing: %s",
                first_error_msg ? first_error_msg : err_string(first_error));
  if (r != ncclSuccess) {
    discard(list);
    first_error = ncclSuccess;
    return api_finish(NULL, r);
  }
  return launch(list, 1);
}

/* The group's time as the cost model sees it, without running it: each
 * communicator's calls one after the other (its work is serialised), the
 * communicators side by side, so the slowest one's sum; in microseconds,
 * as NCCL's tuner reports. The group is closed and its calls dropped. */
static ncclResult_t simulate(struct ncclComm *list, ncclSimInfo_t *sim) {
  double worst = 0;
  for (struct ncclComm *c = list; c; c = c->group_next) {
    double sum = 0;
    for (struct task *t = c->tasks_head; t; t = t->next) {
      double s = 0;
      CHECK(plan_estimate(c, t, &s));
      sum += s;
    }
    if (sum > worst)
      worst = sum;
  }
  sim->estimatedTime = (float)(worst * 1e6);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo) {
  if (depth == 0)
    return api_finish(NULL, err_set(ncclInvalidUsage, "ncclGroupSimulateEnd called without a matching ncclGroupStart"));
  ncclResult_t r = ncclSuccess;
  if (simInfo == NULL)
    r = err_set(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo is NULL");
  else if (simInfo->magic != 0x74685283u || simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float))
    r = err_set(ncclInvalidArgument,
                "ncclGroupSimulateEnd: simInfo was not initialised with NCCL_SIM_INFO_INITIALIZER (magic 0x%x, "
                "size %zu)",
                simInfo->magic, simInfo->size);
  if (--depth > 0) /* an inner group: its calls stay in the outer one */
    return r == ncclSuccess ? ncclSuccess : api_finish(NULL, r);
  struct ncclComm *list = comms_head;
  comms_head = NULL;
  struct group_job *jobs = jobs_head;
  jobs_head = jobs_tail = NULL;
  /* Communicator creations in the group are real: they run. */
  ncclResult_t jr = run_jobs(jobs);
  if (r == ncclSuccess && first_error != ncclSuccess)
    r = err_set(first_error, "an operation in this group failed, so there is nothing to simulate: %s",
                first_error_msg ? first_error_msg : err_string(first_error));
  if (r == ncclSuccess)
    r = jr;
  if (r == ncclSuccess)
    r = simulate(list, simInfo);
  first_error = ncclSuccess;
  discard(list);
  return api_finish(NULL, r);
}
