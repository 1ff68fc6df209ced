/*
 * NCCL 2.28-2.30's revoking of a communicator (growing it is
 * comm_grow.c's; suspending and resuming its memory, comm_suspend.c's).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "async.h"
#include "comm_api.h"
#include "exec/cuda/cuda_exec.h"

#include <stdatomic.h>

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
  if (atomic_load(&comm->suspended) || comm->suspend_queued)
    return api_finish(comm, err_set(ncclInvalidUsage,
                                    "ncclCommRevoke: the communicator is suspended; call ncclCommResume"));
  if (atomic_exchange(&comm->revoked, 1))
    return api_finish(comm, ncclSuccess); /* revoked already */
  __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST);
  comm_hold(comm, "ncclCommRevoke");
  async_wait(comm);
  if (!comm->is_host)
    cuda_comm_stop(comm);
  __atomic_store_n(&comm->abort_flag, 0, __ATOMIC_SEQ_CST);
  INFO(LOG_INIT, "comm %p rank %d nranks %d - Revoke COMPLETE", (void *)comm, comm->rank, comm->nranks);
  ncclResult_t r = api_finish(comm, ncclSuccess);
  comm_leave(comm);
  return r;
}
