/*
 * NCCL 2.29-2.30's suspension of a communicator's memory: ncclCommSuspend
 * with NCCL_SUSPEND_MEM waits for the communicator's work to end, then
 * frees every connection (FIFOs, segments, device buffers, network
 * connections and their registrations) and, on a CUDA communicator, the
 * executor (launch arenas, proxy thread); ncclCommResume builds the same
 * connections again, with the same peers. Both are collective, as in
 * NCCL: a connection has two ends, and freeing one while the peer still
 * uses it, or connecting one that the peer does not, cannot work.
 * ncclCommMemStats reports what the communicator holds (docs/using.md
 * says what is counted; docs/decisions.md why).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "algorithms/tuner.h"
#include "bootstrap/bootstrap.h"
#include "comm_api.h"
#include "exec/cuda/cuda_exec.h"
#include "group.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "transport/shm_arena.h"
#include "transport/transport.h"

#include <stdatomic.h>
#include <stdlib.h>

/* A connection as Resume makes it again. */
struct conn_key {
  int kind, channel, peer, dir;
};

struct suspend_state {
  struct conn_key *conns;
  int nconns, cap;
  int coll_conns;
  /* What the released memory was, reported while suspended as NCCL
   * reports it: the bytes that can be suspended stay counted. */
  uint64_t bytes;
};

void comm_suspend_free(struct ncclComm *comm) {
  if (comm->suspend) {
    free(comm->suspend->conns);
    free(comm->suspend);
    comm->suspend = NULL;
  }
}

/* What Suspend releases and what stays, in the unit of the communicator's
 * kind: device memory on a CUDA communicator, the host memory of its
 * FIFOs on a host one (which has no other). Loom keeps nothing of this
 * kind that Suspend cannot release, so `persist` is 0. */
static void mem_now(struct ncclComm *comm, uint64_t *releasable, uint64_t *persist) {
  uint64_t dev = 0, host = 0;
  transport_mem(comm, &dev, &host);
  if (comm->arena)
    host += comm->arena->map_size;
  *releasable = comm->is_host ? host : dev + cuda_comm_dev_bytes(comm);
  *persist = 0;
}

static void note_conn(struct conn *c, void *arg) {
  struct suspend_state *s = arg;
  if (!c->connected || s->nconns < 0)
    return;
  if (s->nconns == s->cap) {
    int cap = s->cap ? 2 * s->cap : 16;
    struct conn_key *k = realloc(s->conns, sizeof *k * (size_t)cap);
    if (!k) {
      s->nconns = -1; /* told by the caller */
      return;
    }
    s->conns = k;
    s->cap = cap;
  }
  s->conns[s->nconns++] = (struct conn_key){c->kind, c->channel, c->peer, c->dir};
}

/* Every rank has ended its work on the communicator (a host call returns
 * when its result is there; a CUDA rank has waited for its kernels and
 * its network sends to leave), so no rank frees what a peer still reads. */
static ncclResult_t barrier(struct ncclComm *comm, const char *func) {
  ncclResult_t r = bootstrap_barrier(comm->boot, func);
  if (r != ncclSuccess)
    err_context("rank %d: %s waits for every rank of the communicator to call it", comm->rank, func);
  return r;
}

static ncclResult_t suspend_run(struct ncclComm *comm) {
  struct suspend_state *s;
  CHECK(UTIL_CALLOC(&s, 1, "ncclCommSuspend"));
  transport_each_conn(comm, note_conn, s);
  if (s->nconns < 0) {
    free(s->conns);
    free(s);
    return err_set(ncclSystemError, "ncclCommSuspend: out of memory listing the connections to rebuild");
  }
  s->coll_conns = comm->coll_conns;
  uint64_t persist;
  mem_now(comm, &s->bytes, &persist);
  ncclResult_t r = ncclSuccess;
  if (!comm->is_host) {
    int saved = cuda_current_device();
    r = cuda_set_device(comm->cuda_dev);
    /* Kernels end and their sends leave; the proxy watches them meanwhile
     * (a stuck kernel becomes the error instead of a hang). */
    if (r == ncclSuccess)
      r = cuda_comm_finalize(comm);
    if (r == ncclSuccess) {
      /* Stopped before the barrier: no proxy may still look at a
       * connection once a peer closes its end. */
      cuda_comm_fini(comm, 0);
      comm->poison_conns = transport_poison_conns;
    }
    cuda_restore_device(saved);
  }
  if (r == ncclSuccess)
    r = barrier(comm, "ncclCommSuspend");
  if (r != ncclSuccess) {
    free(s->conns);
    free(s);
    /* The executor may be gone: nothing but destroy and abort is safe. */
    comm_set_error(comm, r);
    return r;
  }
  int saved = comm->is_host ? -1 : cuda_current_device();
  if (!comm->is_host)
    cuda_set_device(comm->cuda_dev);
  transport_free_all(comm);
  cuda_restore_device(saved);
  /* Made again by Resume, as every rank suspends and resumes. */
  arena_free(comm);
  comm->tuner->in.flat_ok = 0;
  /* Their schedules name the freed connections. */
  comm_free_works(comm);
  free(comm->lanes);
  comm->lanes = NULL;
  comm->suspend = s;
  atomic_store(&comm->suspended, 1);
  INFO(LOG_INIT, "comm %p rank %d nranks %d - Suspend COMPLETE: %d connection(s), %llu bytes released",
       (void *)comm, comm->rank, comm->nranks, s->nconns, (unsigned long long)s->bytes);
  return ncclSuccess;
}

static ncclResult_t rebuild(struct ncclComm *comm) {
  struct suspend_state *s = comm->suspend;
  if (!comm->is_host)
    CHECK(cuda_comm_init(comm));
  struct conn *c;
  for (int i = 0; i < s->nconns; i++)
    CHECK(transport_get_conn(comm, s->conns[i].kind, s->conns[i].channel, s->conns[i].peer, s->conns[i].dir, &c));
  CHECK(transport_connect_pending(&comm, 1));
  CHECK(comm_arena_setup(comm));
  comm->coll_conns = s->coll_conns;
  /* Ranks leave together: a CUDA rank's allocations must not meet a
   * peer's first kernel after the resume (init.c's connect_cuda). */
  return barrier(comm, "ncclCommResume");
}

static ncclResult_t resume_run(struct ncclComm *comm) {
  int saved = comm->is_host ? -1 : cuda_current_device();
  ncclResult_t r = comm->is_host ? ncclSuccess : cuda_set_device(comm->cuda_dev);
  if (r == ncclSuccess)
    r = rebuild(comm);
  cuda_restore_device(saved);
  if (r != ncclSuccess) {
    err_context("rank %d: ncclCommResume rebuilding the communicator's connections", comm->rank);
    comm_set_error(comm, r);
    return r;
  }
  int n = comm->suspend->nconns;
  comm_suspend_free(comm);
  atomic_store(&comm->suspended, 0);
  INFO(LOG_INIT, "comm %p rank %d nranks %d - Resume COMPLETE: %d connection(s) rebuilt", (void *)comm,
       comm->rank, comm->nranks, n);
  return ncclSuccess;
}

/* One thread inside the communicator, as for every call. */
static ncclResult_t entered(struct ncclComm *comm, const char *func, ncclResult_t (*run)(struct ncclComm *)) {
  CHECK(comm_enter(comm, func));
  log_set_rank(comm->rank);
  ncclResult_t r = run(comm);
  comm_leave(comm);
  return r;
}

/* Inside ncclGroupStart/End the call waits for the group's end, where
 * each communicator's runs on a thread of its own: one thread that drives
 * several ranks suspends them all together. */
struct suspend_job {
  struct group_job base;
  ncclResult_t (*run)(struct ncclComm *);
  const char *func;
};

static ncclResult_t job_run(struct group_job *job) {
  struct suspend_job *j = (struct suspend_job *)job;
  /* Aborted meanwhile (destroy refuses while a job waits). */
  if (!comm_live(j->base.comm)) {
    j->base.comm = NULL;
    return comm_not_a_comm(j->func);
  }
  j->base.comm->suspend_queued = 0;
  return entered(j->base.comm, j->func, j->run);
}

static ncclResult_t queue_job(struct ncclComm *comm, const char *func, ncclResult_t (*run)(struct ncclComm *),
                              int what) {
  struct suspend_job *j = calloc(1, sizeof *j);
  if (!j)
    return err_set(ncclSystemError, "%s: out of memory queueing it in the group", func);
  j->base.fn = job_run;
  j->base.comm = comm;
  j->run = run;
  j->func = func;
  comm->suspend_queued = what;
  return group_add_job(&j->base);
}

static ncclResult_t check_common(struct ncclComm *comm, const char *func) {
  CHECK(comm_check_even_suspended(comm, func));
  if (comm->suspend_queued)
    return err_set(ncclInvalidUsage, "%s: %s of this communicator is already queued in this group; call it after "
                   "ncclGroupEnd", func, comm->suspend_queued == 1 ? "ncclCommSuspend" : "ncclCommResume");
  if (comm->in_group)
    return err_set(ncclInvalidUsage,
                   "%s: the communicator has operations queued in this group; call it before ncclGroupStart or "
                   "after ncclGroupEnd", func);
  return ncclSuccess;
}

static ncclResult_t suspend_api(struct ncclComm *comm, int flags) {
  CHECK(comm_check_even_suspended(comm, "ncclCommSuspend"));
  if (flags & ~NCCL_SUSPEND_MEM)
    return err_set(ncclInvalidArgument,
                   "ncclCommSuspend: flags is 0x%x; the only flag is NCCL_SUSPEND_MEM (0x%x). Nothing was done",
                   (unsigned)flags, (unsigned)NCCL_SUSPEND_MEM);
  CHECK(check_common(comm, "ncclCommSuspend"));
  if (atomic_load(&comm->suspended))
    return err_set(ncclInvalidUsage, "ncclCommSuspend: the communicator is suspended already; call ncclCommResume");
  /* As NCCL: no flag, nothing to suspend, and no rank waits for another. */
  if (!(flags & NCCL_SUSPEND_MEM))
    return ncclSuccess;
  if (group_depth() > 0)
    return queue_job(comm, "ncclCommSuspend", suspend_run, 1);
  return entered(comm, "ncclCommSuspend", suspend_run);
}

NCCL_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags) {
  return api_finish(comm_live(comm) ? comm : NULL, suspend_api(comm, flags));
}

static ncclResult_t resume_api(struct ncclComm *comm) {
  CHECK(check_common(comm, "ncclCommResume"));
  if (!atomic_load(&comm->suspended))
    return err_set(ncclInvalidUsage, "ncclCommResume: the communicator is not suspended (ncclCommSuspend with "
                   "NCCL_SUSPEND_MEM suspends it)");
  if (group_depth() > 0)
    return queue_job(comm, "ncclCommResume", resume_run, 2);
  return entered(comm, "ncclCommResume", resume_run);
}

NCCL_API(ncclResult_t, ncclCommResume, ncclComm_t comm) {
  return api_finish(comm_live(comm) ? comm : NULL, resume_api(comm));
}

static ncclResult_t mem_stats(struct ncclComm *comm, ncclCommMemStat_t stat, uint64_t *value) {
  /* Works on failed communicators too, as the queries do. */
  if (comm == NULL)
    return err_set(ncclInvalidArgument, "ncclCommMemStats: comm is NULL");
  if (!comm_live(comm))
    return comm_not_a_comm("ncclCommMemStats");
  if (value == NULL)
    return err_set(ncclInvalidArgument, "ncclCommMemStats: value is NULL");
  if ((int)stat < (int)ncclStatGpuMemSuspend || (int)stat > (int)ncclStatGpuMemTotal)
    return err_set(ncclInvalidArgument,
                   "ncclCommMemStats: stat is %d; it must be ncclStatGpuMemSuspend (0), ncclStatGpuMemSuspended (1), "
                   "ncclStatGpuMemPersist (2) or ncclStatGpuMemTotal (3)",
                   (int)stat);
  if (comm->rank < 0)
    return err_set(ncclInvalidUsage, "ncclCommMemStats: the communicator is still being created");
  /* The connections are read, so no other call may be changing them. */
  CHECK(comm_enter(comm, "ncclCommMemStats"));
  uint64_t releasable, persist;
  mem_now(comm, &releasable, &persist);
  int suspended = atomic_load(&comm->suspended);
  if (suspended)
    releasable = comm->suspend->bytes;
  comm_leave(comm);
  switch (stat) {
  case ncclStatGpuMemSuspend: *value = releasable; break;
  case ncclStatGpuMemSuspended: *value = (uint64_t)suspended; break;
  case ncclStatGpuMemPersist: *value = persist; break;
  default: *value = releasable + persist; break;
  }
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  return api_finish(comm_live(comm) ? comm : NULL, mem_stats(comm, stat, value));
}
