/*
 * The worker thread of a nonblocking communicator: it sleeps on a
 * condition variable until a job comes, runs it, and marks the
 * communicators it involved done.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "async.h"

#include "comm_api.h"
#include "misc/utils.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct async_worker {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int stop;
  async_fn fn; /* the pending job, NULL when idle */
  void *arg;
  struct ncclComm **comms; /* the job's communicators */
  int ncomms;
};

static void *worker_main(void *p) {
  struct async_worker *w = p;
  pthread_mutex_lock(&w->lock);
  for (;;) {
    while (!w->fn && !w->stop)
      pthread_cond_wait(&w->cond, &w->lock);
    if (!w->fn)
      break;
    async_fn fn = w->fn;
    void *arg = w->arg;
    struct ncclComm **comms = w->comms;
    int n = w->ncomms;
    pthread_mutex_unlock(&w->lock);
    fn(arg);
    /* Done is published after the job's results (release), and leaving is
     * the job's last touch of each communicator: an abort or destroy
     * waiting for it may free them at once. */
    for (int i = 0; i < n; i++)
      atomic_store_explicit(&comms[i]->async_busy, 0, memory_order_release);
    for (int i = 0; i < n; i++)
      comm_leave(comms[i]);
    free(comms);
    pthread_mutex_lock(&w->lock);
    w->fn = NULL;
    w->comms = NULL;
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

static ncclResult_t worker_start(struct ncclComm *comm) {
  struct async_worker *w;
  CHECK(UTIL_CALLOC(&w, 1, "a nonblocking communicator's worker"));
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->cond, NULL);
  int rc = pthread_create(&w->thread, NULL, worker_main, w);
  if (rc != 0) {
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w);
    return err_set(ncclSystemError, "cannot start the worker thread of a nonblocking communicator: %s",
                   strerror(rc));
  }
  comm->worker = w;
  return ncclSuccess;
}

ncclResult_t async_submit(struct ncclComm *owner, struct ncclComm **comms, int ncomms, async_fn fn, void *arg) {
  if (!owner->worker)
    CHECK(worker_start(owner));
  struct ncclComm **copy;
  CHECK(UTIL_CALLOC(&copy, ncomms, "a nonblocking job"));
  memcpy(copy, comms, sizeof *copy * (size_t)ncomms);
  for (int i = 0; i < ncomms; i++)
    atomic_store(&comms[i]->async_busy, 1);
  struct async_worker *w = owner->worker;
  pthread_mutex_lock(&w->lock);
  w->fn = fn;
  w->arg = arg;
  w->comms = copy;
  w->ncomms = ncomms;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
  return ncclSuccess;
}

void async_wait(const struct ncclComm *comm) {
  /* Jobs end by themselves within LOOM_TIMEOUT; this is teardown, rare
   * enough that polling costs nothing. */
  while (comm_async_busy(comm)) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

void async_stop(struct ncclComm *comm) {
  struct async_worker *w = comm->worker;
  if (!w)
    return;
  pthread_mutex_lock(&w->lock);
  w->stop = 1;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
  /* The worker finishes its job first; a job never destroys its own
   * communicator, so this is never the worker itself. */
  pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->lock);
  pthread_cond_destroy(&w->cond);
  free(w);
  comm->worker = NULL;
}
