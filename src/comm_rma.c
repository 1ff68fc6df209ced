/*
 * NCCL 2.29-2.30's one-sided operations on registered windows: a put
 * with a signal, a signal, a wait for signals, and the pointers through
 * which a peer's window is loaded and stored directly, between ranks of
 * one host. A put copies straight into the peer's window as this process
 * maps it (comm_mem.c), then raises a counter of the peer's (release); a
 * wait reads its own counters (acquire) and consumes what it waited for.
 * On a CUDA communicator the copy is queued on the stream and the counter
 * raised by a host function once the stream gets there; the wait is the
 * host's, so that what is queued after it starts after the signals.
 * A host communicator's peers on other hosts get puts and signals as
 * frames to their one-sided service (comm_rma_net.c); a CUDA
 * communicator's are refused with a sentence: not built yet.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "api.h"
#include "comm_api.h"
#include "common/dtype.h"
#include "group.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "rma.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* The checks every one-sided call starts with. */
static ncclResult_t rma_check_comm(struct ncclComm *comm, cudaStream_t stream, const char *func) {
  CHECK(comm_check(comm, func));
  if (!comm->is_host)
    return cuda_stream_check(stream, func, comm->rank, 0);
  if (stream != NULL)
    return err_set(ncclInvalidArgument,
                   "%s: stream must be NULL on a host communicator (its buffers are host memory and the call "
                   "returns when it is done)",
                   func);
  return ncclSuccess;
}

static ncclResult_t rma_check_signal(const struct ncclComm *comm, int peer, int sigIdx, int ctx, const char *func) {
  if (peer < 0 || peer >= comm->nranks)
    return err_set(ncclInvalidArgument, "%s: peer %d is out of range for a communicator of %d ranks", func, peer,
                   comm->nranks);
  if (sigIdx < 0 || sigIdx >= RMA_SIGNALS)
    return err_set(ncclInvalidArgument, "%s: sigIdx %d is out of range (Loom has signal indices 0 to %d)", func,
                   sigIdx, RMA_SIGNALS - 1);
  if (ctx < 0 || ctx >= RMA_CTXS)
    return err_set(ncclInvalidArgument, "%s: ctx %d is out of range (Loom has contexts 0 to %d)", func, ctx,
                   RMA_CTXS - 1);
  return ncclSuccess;
}

static ncclResult_t rma_signals(const struct ncclComm *comm, const char *func) {
  /* Every communicator sets them up at init (rma_signals_create). */
  if (comm->rma == NULL || !comm->rma->sig_ready)
    return err_set(ncclInternalError, "%s: the communicator has no one-sided signals", func);
  return ncclSuccess;
}

struct raise_arg {
  _Atomic uint64_t *counter;
  _Atomic int *pending;
};

/* On the host, once the stream has reached the signal: what the stream
 * did before (a put's copy) is complete. */
static void raise_cb(void *p) {
  struct raise_arg *a = p;
  atomic_fetch_add_explicit(a->counter, 1, memory_order_release);
  atomic_fetch_sub(a->pending, 1);
  free(a);
}

/* Raises rank `peer`'s counter of this rank's signals on (ctx, sigIdx):
 * release, so that what this thread wrote before (a put's data) is seen
 * by the thread that acquires the count. A CUDA communicator raises it
 * once `stream` gets there. */
static ncclResult_t raise_signal(struct ncclComm *comm, int peer, int sigIdx, int ctx, cudaStream_t stream,
                                 const char *func) {
  struct rma_state *st = comm->rma;
  if (st->sig_peer[peer] == NULL && rma_net_remote(comm, peer))
    return rma_net_send(comm, peer, 0, 0, NULL, 0, ctx, sigIdx, func);
  if (st->sig_peer[peer] == NULL)
    return err_set(ncclInvalidUsage, "%s to rank %d: %s. Nothing was done", func, peer,
                   st->sig_why[peer] ? st->sig_why[peer] : "its signals cannot be reached");
  _Atomic uint64_t *counter = &st->sig_peer[peer][rma_sig_index(comm, ctx, sigIdx, comm->rank)];
  if (comm->is_host) {
    atomic_fetch_add_explicit(counter, 1, memory_order_release);
    return ncclSuccess;
  }
  struct raise_arg *a = malloc(sizeof *a);
  if (!a)
    return err_set(ncclSystemError, "%s: out of memory", func);
  *a = (struct raise_arg){counter, &st->pending};
  atomic_fetch_add(&st->pending, 1);
  ncclResult_t r = cuda_host_func(stream, raise_cb, a, "a one-sided signal");
  if (r != ncclSuccess) {
    atomic_fetch_sub(&st->pending, 1);
    free(a);
  }
  return r;
}

/* A put into a window of another process that it cannot map (not from
 * ncclMemAlloc): written into that process, which needs the right to
 * ptrace it. The peer is checked alive first (its pidfd), so that its
 * pid still names it. */
static ncclResult_t write_process(struct ncclComm *comm, int peer, const struct rma_peer_win *pw, size_t offset,
                                  const void *src, size_t bytes, const char *func) {
  if (comm_peer_alive(comm, peer) != ncclSuccess) {
    err_context("%s to rank %d", func, peer);
    return ncclRemoteError;
  }
  size_t done = 0;
  while (done < bytes) {
    struct iovec local = {(char *)src + done, bytes - done};
    struct iovec remote = {(void *)(uintptr_t)(pw->vm_addr + offset + done), bytes - done};
    ssize_t n = process_vm_writev(pw->vm_pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      int e = n < 0 ? errno : EIO;
      return err_set(ncclInvalidUsage,
                     "%s to rank %d: %s; writing into its process (pid %d) instead failed after %zu of %zu bytes: "
                     "process_vm_writev: %s%s",
                     func, peer, pw->why, pw->vm_pid, done, bytes, strerror(e),
                     e == EPERM ? " (it needs the right to ptrace the process, which Yama's ptrace_scope may withhold)"
                                : "");
    }
    done += (size_t)n;
  }
  return ncclSuccess;
}

static ncclResult_t put_signal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
                               struct ncclComm *comm, cudaStream_t stream) {
  const char *func = "ncclPutSignal";
  CHECK(rma_check_comm(comm, stream, func));
  if (flags != 0)
    return err_set(ncclInvalidArgument, "%s: flags 0x%x: they are reserved and must be 0", func, flags);
  CHECK(rma_check_signal(comm, peer, sigIdx, ctx, func));
  if ((int)datatype < 0 || datatype >= ncclNumTypes)
    return err_set(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t (0..%d)", func, (int)datatype,
                   ncclNumTypes - 1);
  if (count > 0 && localbuff == NULL)
    return err_set(ncclInvalidArgument, "%s: localbuff is NULL (count %zu)", func, count);
  if (count > 0 && !comm->is_host)
    CHECK(cuda_check_pointer(localbuff, 0, comm->cuda_dev, func, "localbuff"));
  struct rma_win *w = NULL;
  CHECK(rma_win_lookup(comm, peerWin, func, &w));
  CHECK(rma_signals(comm, func));
  size_t esize = dtype_size(datatype);
  const struct rma_peer_win *pw = &w->peer[peer];
  if (count > SIZE_MAX / esize || peerWinOffset > pw->size || count * esize > pw->size - peerWinOffset)
    return err_set(ncclInvalidArgument,
                   "%s: %zu elements of %s at offset %zu do not fit in rank %d's window of %zu bytes. Nothing was done",
                   func, count, dtype_name(datatype), peerWinOffset, peer, pw->size);
  /* Data and signal in one frame, in order behind what went before. */
  if (rma_net_remote(comm, peer))
    return rma_net_send(comm, peer, w->id, peerWinOffset, localbuff, count * esize, ctx, sigIdx, func);
  if (count > 0 && pw->ptr == NULL && pw->vm_pid == 0)
    return err_set(ncclInvalidUsage, "%s to rank %d: %s. Nothing was done", func, peer, pw->why);
  if (count > 0 && !comm->is_host)
    CHECK(cuda_memcpy_async(pw->ptr + peerWinOffset, localbuff, count * esize, stream, "ncclPutSignal"));
  else if (count > 0 && pw->ptr != NULL)
    memmove(pw->ptr + peerWinOffset, localbuff, count * esize);
  else if (count > 0)
    CHECK(write_process(comm, peer, pw, peerWinOffset, localbuff, count * esize, func));
  return raise_signal(comm, peer, sigIdx, ctx, stream, func);
}

static ncclResult_t signal_only(int peer, int sigIdx, int ctx, unsigned int flags, struct ncclComm *comm,
                                cudaStream_t stream) {
  const char *func = "ncclSignal";
  CHECK(rma_check_comm(comm, stream, func));
  if (flags != 0)
    return err_set(ncclInvalidArgument, "%s: flags 0x%x: they are reserved and must be 0", func, flags);
  CHECK(rma_check_signal(comm, peer, sigIdx, ctx, func));
  CHECK(rma_signals(comm, func));
  return raise_signal(comm, peer, sigIdx, ctx, stream, func);
}

/* The signals one wait needs: the descriptors' counts summed by (peer,
 * sigIdx, ctx). */
struct need {
  size_t index;
  int peer, sigIdx, ctx;
  uint64_t count;
};

static ncclResult_t wait_signal(int nDesc, const ncclWaitSignalDesc_t *descs, struct ncclComm *comm,
                                cudaStream_t stream) {
  const char *func = "ncclWaitSignal";
  CHECK(rma_check_comm(comm, stream, func));
  if (nDesc < 0)
    return err_set(ncclInvalidArgument, "%s: nDesc is %d", func, nDesc);
  if (nDesc > 0 && descs == NULL)
    return err_set(ncclInvalidArgument, "%s: signalDescs is NULL (nDesc %d)", func, nDesc);
  for (int i = 0; i < nDesc; i++) {
    CHECK(rma_check_signal(comm, descs[i].peer, descs[i].sigIdx, descs[i].ctx, func));
    if (descs[i].opCnt < 0)
      return err_set(ncclInvalidArgument, "%s: signalDescs[%d].opCnt is %d", func, i, descs[i].opCnt);
  }
  /* Waiting here, before the group's end, could hold up the very sends
   * the peers wait for before they signal. */
  if (group_depth() > 0)
    return err_set(ncclInvalidUsage,
                   "%s inside ncclGroupStart/ncclGroupEnd is not implemented yet in Loom; call it after "
                   "ncclGroupEnd",
                   func);
  if (nDesc == 0)
    return ncclSuccess;
  CHECK(rma_signals(comm, func));
  struct rma_state *st = comm->rma;
  struct need *need = calloc((size_t)nDesc, sizeof *need);
  if (!need)
    return err_set(ncclSystemError, "%s: out of memory", func);
  int n = 0;
  for (int i = 0; i < nDesc; i++) {
    size_t idx = rma_sig_index(comm, descs[i].ctx, descs[i].sigIdx, descs[i].peer);
    int k = 0;
    while (k < n && need[k].index != idx)
      k++;
    if (k == n)
      need[n++] = (struct need){idx, descs[i].peer, descs[i].sigIdx, descs[i].ctx, 0};
    need[k].count += (uint64_t)descs[i].opCnt;
  }
  struct waiter wt;
  wait_init(&wt, comm->spin_ns, comm->yield_ns);
  uint64_t last_seen = 0, idle_since = time_ns(), next_check = 0;
  ncclResult_t r = ncclSuccess;
  for (;;) {
    int ready = 1, missing = -1;
    uint64_t seen = 0;
    for (int k = 0; k < n; k++) {
      uint64_t c = atomic_load_explicit(&st->sig_own[need[k].index], memory_order_acquire);
      seen += c;
      if (c - st->consumed[need[k].index] < need[k].count) {
        ready = 0;
        if (missing < 0)
          missing = k;
      }
    }
    if (ready)
      break;
    if (seen != last_seen) {
      last_seen = seen;
      idle_since = time_ns();
      wait_reset(&wt);
      continue;
    }
    wait_pause(&wt);
    uint64_t now = time_ns();
    if (now < next_check)
      continue;
    next_check = now + 100000000ull;
    if (comm_aborted(comm)) {
      r = err_set(ncclInvalidUsage, "rank %d: the communicator was aborted during %s", comm->rank, func);
      break;
    }
    const struct need *m = &need[missing];
    uint64_t got = atomic_load_explicit(&st->sig_own[m->index], memory_order_acquire) - st->consumed[m->index];
    if (m->peer != comm->rank && (r = comm_peer_alive(comm, m->peer)) != ncclSuccess) {
      err_context("%s: waiting for %llu signal(s) from rank %d (sigIdx %d, ctx %d), %llu came", func,
                  (unsigned long long)m->count, m->peer, m->sigIdx, m->ctx, (unsigned long long)got);
      break;
    }
    if (now - idle_since >= comm_timeout_ns(comm)) {
      char note[300] = "", bound[TIMEOUT_NAME_LEN];
      if (m->peer != comm->rank)
        comm_note_peer(comm, m->peer, note, sizeof note);
      r = err_set(ncclRemoteError,
                  "%s: rank %d timed out after %s waiting for %llu signal(s) from rank %d (sigIdx %d, ctx %d) and "
                  "%llu came%s; none was consumed",
                  func, comm->rank, comm_timeout_name(comm, bound, sizeof bound), (unsigned long long)m->count,
                  m->peer, m->sigIdx, m->ctx, (unsigned long long)got, note);
      break;
    }
  }
  /* All or nothing: a wait that fails leaves the counts for the next. */
  for (int k = 0; r == ncclSuccess && k < n; k++)
    st->consumed[need[k].index] += need[k].count;
  free(need);
  return r;
}

/* Inside a group a refused call fails the group too, as collectives do. */
static ncclResult_t rma_finish(struct ncclComm *comm, ncclResult_t r) {
  if (r != ncclSuccess && group_depth() > 0)
    group_record_error(r);
  return api_finish(comm, r);
}

#define RMA_CALL(func, expr)                                                                                           \
  do {                                                                                                                 \
    ncclResult_t r_ = comm_enter(comm, func);                                                                          \
    if (r_ != ncclSuccess)                                                                                             \
      return rma_finish(NULL, r_);                                                                                     \
    r_ = rma_finish(comm, (expr));                                                                                     \
    comm_leave(comm);                                                                                                  \
    return r_;                                                                                                         \
  } while (0)

NCCL_API(ncclResult_t, ncclPutSignal, const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
         cudaStream_t stream) {
  RMA_CALL("ncclPutSignal",
           put_signal(localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx, ctx, flags, comm, stream));
}

NCCL_API(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
         cudaStream_t stream) {
  RMA_CALL("ncclSignal", signal_only(peer, sigIdx, ctx, flags, comm, stream));
}

NCCL_API(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
         cudaStream_t stream) {
  RMA_CALL("ncclWaitSignal", wait_signal(nDesc, signalDescs, comm, stream));
}

/* These calls name no communicator: the window's is found in the
 * process's list of windows, before anything in the window is read. */
static ncclResult_t peer_pointer(ncclWindow_t window, size_t offset, int peer, int lsa, void **outPtr,
                                 struct ncclComm **owner, const char *func) {
  if (outPtr == NULL)
    return err_set(ncclInvalidArgument, "%s: outPtr is NULL", func);
  *outPtr = NULL;
  if (window == NULL)
    return err_set(ncclInvalidArgument, "%s: window is NULL", func);
  struct ncclComm *comm = rma_win_owner(window);
  if (comm == NULL || !comm_live(comm))
    return err_set(ncclInvalidArgument, "%s: %p is not a registered window (or it was deregistered)", func,
                   (void *)window);
  struct rma_win *w = NULL;
  CHECK(rma_win_lookup(comm, window, func, &w));
  *owner = comm;
  if (lsa) {
    /* The LSA team: the consecutive ranks around this one on its host
     * (device_api.c's teams), numbered from 0. */
    uint64_t h = comm->peers[comm->rank].host_hash;
    int lo = comm->rank, hi = comm->rank;
    while (lo > 0 && comm->peers[lo - 1].host_hash == h)
      lo--;
    while (hi + 1 < comm->nranks && comm->peers[hi + 1].host_hash == h)
      hi++;
    if (peer < 0 || peer > hi - lo)
      return err_set(ncclInvalidArgument, "%s: lsaRank %d is out of range for this rank's LSA team of %d ranks", func,
                     peer, hi - lo + 1);
    peer += lo;
  } else if (peer < 0 || peer >= comm->nranks) {
    return err_set(ncclInvalidArgument, "%s: peer %d is out of range for a communicator of %d ranks", func, peer,
                   comm->nranks);
  }
  const struct rma_peer_win *pw = &w->peer[peer];
  if (offset >= pw->size)
    return err_set(ncclInvalidArgument, "%s: offset %zu is past the end of rank %d's window of %zu bytes", func,
                   offset, peer, pw->size);
  if (pw->ptr == NULL)
    return err_set(ncclInvalidUsage, "%s: rank %d's window cannot be loaded and stored from this rank: %s", func,
                   peer, pw->why);
  *outPtr = pw->ptr + offset;
  return ncclSuccess;
}

/* A refusal is the window's communicator's last error too, where the
 * window is one. */
NCCL_API(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t window, size_t offset, int peer, void **outPtr) {
  struct ncclComm *comm = NULL;
  ncclResult_t r = peer_pointer(window, offset, peer, 0, outPtr, &comm, "ncclGetPeerDevicePointer");
  return api_finish(comm, r);
}

/* lsaRank numbers the ranks of this rank's LSA team (ncclTeamLsa). */
NCCL_API(ncclResult_t, ncclGetLsaDevicePointer, ncclWindow_t window, size_t offset, int lsaRank, void **outPtr) {
  struct ncclComm *comm = NULL;
  ncclResult_t r = peer_pointer(window, offset, lsaRank, 1, outPtr, &comm, "ncclGetLsaDevicePointer");
  return api_finish(comm, r);
}
