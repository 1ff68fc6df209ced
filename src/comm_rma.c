/*
 * NCCL 2.29-2.30's one-sided operations on registered windows (put with
 * a signal, signal, wait for signals) and the pointers through which a
 * peer's window is loaded and stored directly. Not built yet: windows are
 * registered on one rank only so far (comm_api.c), and these need every
 * rank's window exchanged and mapped. Each call says so and changes
 * nothing.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "comm_api.h"

static ncclResult_t not_yet(const struct ncclComm *comm, const char *func, const char *what) {
  if (comm)
    CHECK(comm_check(comm, func));
  return err_set(ncclInvalidUsage,
                 "%s (%s) is not implemented yet in Loom; use ncclSend and ncclRecv in a group. Nothing was done",
                 func, what);
}

NCCL_API(ncclResult_t, ncclPutSignal, const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
         cudaStream_t stream) {
  (void)localbuff, (void)count, (void)datatype, (void)peer, (void)peerWin, (void)peerWinOffset, (void)sigIdx,
      (void)ctx, (void)flags, (void)stream;
  return api_finish(comm, not_yet(comm, "ncclPutSignal", "a one-sided write into a peer's window"));
}

NCCL_API(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
         cudaStream_t stream) {
  (void)peer, (void)sigIdx, (void)ctx, (void)flags, (void)stream;
  return api_finish(comm, not_yet(comm, "ncclSignal", "a one-sided signal to a peer"));
}

NCCL_API(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
         cudaStream_t stream) {
  (void)nDesc, (void)signalDescs, (void)stream;
  return api_finish(comm, not_yet(comm, "ncclWaitSignal", "waiting for peers' one-sided signals"));
}

NCCL_API(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t window, size_t offset, int peer, void **outPtr) {
  (void)window, (void)offset, (void)peer, (void)outPtr;
  return api_finish(NULL, not_yet(NULL, "ncclGetPeerDevicePointer", "a peer's window, loaded and stored directly"));
}

NCCL_API(ncclResult_t, ncclGetLsaDevicePointer, ncclWindow_t window, size_t offset, int lsaRank, void **outPtr) {
  (void)window, (void)offset, (void)lsaRank, (void)outPtr;
  return api_finish(NULL, not_yet(NULL, "ncclGetLsaDevicePointer", "a peer's window, loaded and stored directly"));
}
