/*
 * NCCL 2.28-2.30's calls on a communicator's life: revoking it,
 * suspending and resuming its memory, and the statistics of that memory
 * (growing it is comm_grow.c's). Revoking works; the others are not built
 * yet: each says so, names what it would do and what to use meanwhile,
 * and changes nothing, so that a program reaching them learns it at the
 * call instead of from a wrong result.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "async.h"
#include "comm_api.h"
#include "exec/cuda/cuda_exec.h"

#include <stdatomic.h>
#include <time.h>

static ncclResult_t not_yet(const struct ncclComm *comm, const char *func, const char *what, const char *instead) {
  CHECK(comm_check(comm, func));
  return err_set(ncclInvalidUsage, "%s (%s) is not implemented yet in Loom; %s. Nothing was done", func, what,
                 instead);
}

/* Revoking stops what is in flight (a nonblocking communicator's job,
 * another thread's call, a CUDA communicator's kernels and proxy) the way
 * ncclCommAbort does, by the abort flag, then lowers the flag again so
 * that the bootstrap can carry a split or shrink; the communicator is left
 * for those and for destroy. Everything returns before this does, so the
 * communicator is quiescent when ncclCommRevoke returns (NCCL reports
 * ncclInProgress until then; here there is no until). */
NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags) {
  if (comm == NULL)
    return api_finish(NULL, err_set(ncclInvalidArgument, "ncclCommRevoke: comm is NULL"));
  if (!comm_live(comm))
    return api_finish(NULL, comm_not_a_comm("ncclCommRevoke"));
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return api_finish(comm, err_set(ncclInvalidArgument,
                                    "ncclCommRevoke: revokeFlags is %d; it must be NCCL_REVOKE_DEFAULT (0)",
                                    revokeFlags));
  if (comm->rank < 0)
    return api_finish(comm, err_set(ncclInvalidUsage, "ncclCommRevoke: the communicator is still being created"));
  if (comm->finalized)
    return api_finish(comm, err_set(ncclInvalidUsage,
                                    "ncclCommRevoke: the communicator was finalized; only ncclCommDestroy may "
                                    "follow"));
  if (atomic_exchange(&comm->revoked, 1))
    return api_finish(comm, ncclSuccess); /* revoked already */
  __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST);
  /* A thread inside a call sees the flag at its next check (every 100 ms
   * of a wait) and leaves; then this holds the communicator. */
  int idle = 0;
  while (!atomic_compare_exchange_strong(&comm->in_call, &idle, 1)) {
    idle = 0;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  atomic_store(&comm->in_call_func, "ncclCommRevoke");
  async_wait(comm);
  if (!comm->is_host)
    cuda_comm_stop(comm);
  __atomic_store_n(&comm->abort_flag, 0, __ATOMIC_SEQ_CST);
  INFO(LOG_INIT, "comm %p rank %d nranks %d - Revoke COMPLETE", (void *)comm, comm->rank, comm->nranks);
  ncclResult_t r = api_finish(comm, ncclSuccess);
  comm_leave(comm);
  return r;
}

NCCL_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags) {
  (void)flags;
  return api_finish(comm, not_yet(comm, "ncclCommSuspend", "releasing the communicator's memory until resumed",
                                  "destroy the communicator and create it again"));
}

NCCL_API(ncclResult_t, ncclCommResume, ncclComm_t comm) {
  return api_finish(comm, not_yet(comm, "ncclCommResume", "rebuilding a suspended communicator's memory",
                                  "no communicator can be suspended"));
}

NCCL_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
  (void)stat, (void)value;
  return api_finish(comm, not_yet(comm, "ncclCommMemStats", "the GPU memory a communicator holds",
                                  "read the device's use with cudaMemGetInfo"));
}
