/*
 * The CUDA executor: a group's works on a CUDA communicator become one
 * kernel launch on the caller's stream; a proxy thread per communicator
 * moves network slots, watches the peers and the kernels, and turns what
 * it sees into the communicator's asynchronous error.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_CUDA_EXEC_H
#define LOOM_CUDA_EXEC_H

#include "exec/host_exec.h"

struct ncclComm;

#if LOOM_HAVE_CUDA
/* How many blocks of the kernel the current device holds at once, for
 * the peer information every rank shares at init. */
ncclResult_t cuda_device_lanes(int32_t *lanes);
/* After the communicator knows its peers: device status and proxy. */
ncclResult_t cuda_comm_init(struct ncclComm *comm);
/* Waits for the communicator's kernels (stopping them first if `abort`),
 * then stops the proxy and frees what the executor holds. */
void cuda_comm_fini(struct ncclComm *comm, int abort);
/* Waits for the communicator's kernels and lets their network sends
 * leave; the communicator's asynchronous error. */
ncclResult_t cuda_comm_finalize(struct ncclComm *comm);
/* The device memory the executor holds for the communicator (its launch
 * arenas, outgrown ones included), for ncclCommMemStats. */
uint64_t cuda_comm_dev_bytes(const struct ncclComm *comm);
/* Makes what a kernel reported (a mismatch) the communicator's error, if
 * nobody has yet: any thread may call it. */
void cuda_comm_poll(struct ncclComm *comm);
/* Stops the kernels and the proxy thread (ncclCommAbort), leaving the
 * connections to the caller's thread. */
void cuda_comm_stop(struct ncclComm *comm);
/* Packs the lanes' works into launches (one, or several where the lanes
 * exceed what the device holds at once), allocating what they need: done
 * for every communicator of a group before the group's first launch,
 * since an allocation may wait for kernels already running. */
ncclResult_t cuda_prepare(struct ncclComm *comm, struct lane *lanes, int nlanes, void *stream);
/* Starts what cuda_prepare packed on `stream`, a kernel per launch, in
 * order; returns at once. */
ncclResult_t cuda_launch(struct ncclComm *comm, void *stream);
#else
static inline ncclResult_t cuda_comm_init(struct ncclComm *comm) {
  return err_set(ncclInternalError, "this build of Loom has no CUDA");
}
static inline ncclResult_t cuda_device_lanes(int32_t *lanes) {
  return err_set(ncclInternalError, "this build of Loom has no CUDA");
}
static inline void cuda_comm_fini(struct ncclComm *comm, int abort) {}
static inline ncclResult_t cuda_comm_finalize(struct ncclComm *comm) { return ncclSuccess; }
static inline void cuda_comm_poll(struct ncclComm *comm) {}
static inline uint64_t cuda_comm_dev_bytes(const struct ncclComm *comm) { return 0; }
static inline void cuda_comm_stop(struct ncclComm *comm) {}
static inline ncclResult_t cuda_prepare(struct ncclComm *comm, struct lane *lanes, int nlanes, void *stream) {
  return err_set(ncclInternalError, "this build of Loom has no CUDA");
}
static inline ncclResult_t cuda_launch(struct ncclComm *comm, void *stream) {
  return err_set(ncclInternalError, "this build of Loom has no CUDA");
}
#endif

#endif
