/*
 * The communicator's primitives, which every floor above may use: the
 * check of a communicator argument, entering and leaving a call, and
 * recording the failure that breaks it. Nothing here calls up: what a
 * failure must also do to the connections, the floor that made them
 * hooked in (comm->poison_conns). The lifecycle and the API's queries are
 * comm_api.c's.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"
#include "misc/utils.h"

#include <sched.h>
#include <stdio.h>
#include <time.h>

ncclResult_t comm_not_a_comm(const char *func) {
  return err_set(ncclInvalidArgument, "%s: comm is not a communicator (never created, or already destroyed)", func);
}

static ncclResult_t busy_refusal(const char *func) {
  return err_set(ncclInvalidUsage,
                 "%s: the communicator's previous call is still in progress (a nonblocking communicator): poll "
                 "ncclCommGetAsyncError until it no longer returns ncclInProgress before the next call",
                 func);
}

ncclResult_t comm_check_even_suspended(const struct ncclComm *comm, const char *func) {
  if (comm == NULL)
    return err_set(ncclInvalidArgument, "%s: comm is NULL", func);
  if (!comm_live(comm))
    return comm_not_a_comm(func);
  if (comm_async_busy(comm))
    return busy_refusal(func);
  if (comm->rank < 0)
    return err_set(ncclInvalidUsage, "%s: the communicator is still being created; call ncclGroupEnd first", func);
  if (atomic_load(&comm->revoked))
    return err_set(ncclInvalidUsage,
                   "%s: the communicator was revoked (ncclCommRevoke); only ncclCommSplit, ncclCommShrink, "
                   "ncclCommDestroy and ncclCommAbort may follow",
                   func);
  if (comm->async_error != ncclSuccess)
    return err_set(comm->async_error, "%s: the communicator failed earlier and can only be destroyed or aborted: %s",
                   func, comm->first_error);
  if (comm->finalized)
    return err_set(ncclInvalidUsage, "%s: the communicator was finalized; only ncclCommDestroy may follow", func);
  return ncclSuccess;
}

ncclResult_t comm_check(const struct ncclComm *comm, const char *func) {
  CHECK(comm_check_even_suspended(comm, func));
  if (atomic_load(&comm->suspended))
    return err_set(ncclInvalidUsage, "%s: the communicator is suspended; call ncclCommResume", func);
  if (comm->suspend_queued == 1)
    return err_set(ncclInvalidUsage,
                   "%s: the communicator is suspended at the end of this group (ncclCommSuspend was called in it); "
                   "call ncclCommResume after ncclGroupEnd",
                   func);
  return ncclSuccess;
}

void comm_set_error(struct ncclComm *comm, ncclResult_t res) {
  if (!comm_live(comm))
    return;
  int unclaimed = 0;
  if (atomic_compare_exchange_strong(&comm->error_claim, &unclaimed, 1)) {
    snprintf(comm->first_error, sizeof comm->first_error, "%s", err_thread_last());
    snprintf(comm->last_error, sizeof comm->last_error, "%s", comm->first_error);
    atomic_store_explicit(&comm->async_error, res, memory_order_release);
  } else if (atomic_load_explicit(&comm->async_error, memory_order_acquire) == ncclSuccess) {
    return; /* another thread is writing it */
  }
  if (comm->poison_conns)
    comm->poison_conns(comm, comm->first_error);
}

ncclResult_t comm_enter(struct ncclComm *comm, const char *func) {
  if (comm == NULL) /* the call's own check says so */
    return ncclSuccess;
  if (!comm_live(comm))
    return comm_not_a_comm(func);
  /* Sequentially consistent on both sides (here, and abort's flag store
   * then load of in_call): either this sees the abort or abort sees us. */
  int idle = 0;
  for (int tries = 0; !atomic_compare_exchange_strong(&comm->in_call, &idle, 1); tries++) {
    if (comm_async_busy(comm))
      return busy_refusal(func);
    /* On a nonblocking communicator the holder may be its worker, which
     * has published the end of its job and is about to leave: a matter of
     * instructions, where another thread's call takes far longer. */
    if (comm->blocking || tries == 1000) {
      const char *other = atomic_load(&comm->in_call_func);
      return err_set(ncclInvalidUsage,
                     "%s: another thread is inside %s on this communicator; a communicator takes one call at a "
                     "time (NCCL's rule): serialise the threads' calls, or give each thread a communicator of its "
                     "own (ncclCommSplit). Nothing was done",
                     func, other ? other : "a call");
    }
    idle = 0;
    sched_yield();
  }
  atomic_store(&comm->in_call_func, func);
  if (__atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST)) {
    atomic_store(&comm->in_call, 0);
    return err_set(ncclInvalidUsage, "%s: the communicator is being aborted (ncclCommAbort)", func);
  }
  return ncclSuccess;
}

/* For abort and revoke, after they raised the abort flag: a thread
 * inside a call notices the flag at its next check (every 100 ms of a
 * wait) and returns; only then may the connections and memory it uses
 * go. The caller then holds the communicator, so that no other thread can
 * enter it. */
void comm_hold(struct ncclComm *comm, const char *func) {
  uint64_t t0 = time_ns();
  int warned = 0, idle = 0;
  while (!atomic_compare_exchange_strong(&comm->in_call, &idle, 1)) {
    idle = 0;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    if (!warned && time_ns() - t0 > 5000000000ull) {
      WARN("rank %d: %s has waited 5 s for the thread inside a call on this communicator to return", comm->rank,
           func);
      warned = 1;
    }
  }
  atomic_store(&comm->in_call_func, func);
}

void comm_leave(struct ncclComm *comm) {
  if (comm_live(comm))
    atomic_store_explicit(&comm->in_call, 0, memory_order_release);
}

uint64_t comm_timeout_ns(const struct ncclComm *comm) {
  return timeout_ns(atomic_load_explicit(&comm->timeout_ns, memory_order_relaxed));
}

uint64_t comm_deadline(const struct ncclComm *comm) { return time_ns() + comm_timeout_ns(comm); }

const char *comm_timeout_name(const struct ncclComm *comm, char *buf, size_t len) {
  return timeout_name(atomic_load_explicit(&comm->timeout_ns, memory_order_relaxed), timeout_seconds(), buf, len);
}

const struct comm_win *comm_win_holding(const struct ncclComm *comm, const void *p, size_t len) {
  const char *c = p;
  for (const struct comm_win *v = comm->direct_wins; v; v = v->next)
    if (c >= v->buff && len <= v->size && (size_t)(c - v->buff) <= v->size - len)
      return v;
  return NULL;
}
