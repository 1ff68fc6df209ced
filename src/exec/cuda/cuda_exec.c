/*
 * The host half of the CUDA executor. A launch copies the group's lanes,
 * works and steps into a device arena (through a pinned twin, on the
 * caller's stream, so it is ordered with the kernel) and starts one block
 * per lane. Arenas are recycled once an event says their kernel is done.
 *
 * The proxy thread keeps the communicator's network connections moving
 * (kernels only write and read the FIFOs' pinned memory), and every 100 ms
 * checks what a kernel cannot: whether a peer has exited or failed,
 * whether the user aborted, whether a kernel reported a mismatch, and
 * whether running kernels have stopped making progress for the
 * communicator's timeout (loomCommSetTimeout, else LOOM_TIMEOUT).
 * Any of these stops the kernels (they poll an abort word) and becomes the
 * communicator's asynchronous error, as NCCL reports it.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"
#include "exec/cuda/cuda_comm.h"
#include "exec/cuda/cuda_exec.h"
#include "exec/cuda/dev.h"
#include "exec/slot.h"
#include "misc/cudamem.h"
#include "misc/place.h"
#include "misc/utils.h"
#include "transport/transport.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the proxy ---------------------------------------------------------- */

/* The sentence for what a kernel reported, once. */
static void kernel_error(struct cuda_comm *cc) {
  struct dev_status *st = cc->status;
  struct slot_hdr got = st->got, want = st->want;
  ncclResult_t r = slot_mismatch(&want, &got, cc->comm->rank, st->peer, got.coll != COLL_SEND);
  err_context("rank %d, on the GPU", cc->comm->rank);
  comm_set_error(cc->comm, r);
}

/* What a kernel reported, as the communicator's error; 1 if there was
 * anything. */
static int poll_kernel(struct cuda_comm *cc) {
  if (__atomic_load_n(&cc->status->error, __ATOMIC_ACQUIRE) != DEV_ERR_MISMATCH)
    return 0;
  int no = 0;
  if (atomic_compare_exchange_strong(&cc->kernel_reported, &no, 1))
    kernel_error(cc);
  return 1;
}

void cuda_comm_poll(struct ncclComm *comm) {
  if (comm->cuda && comm->cuda->status)
    poll_kernel(comm->cuda);
}

static void poison_now(struct cuda_comm *cc) {
  if (atomic_exchange(&cc->poison_asked, 0))
    transport_poison_conns(cc->comm, cc->comm->first_error);
}

/* comm->poison_conns of a CUDA communicator. */
static void cuda_poison_conns(struct ncclComm *comm, const char *why) {
  struct cuda_comm *cc = comm->cuda;
  if (cc && cc->proxy_started && !pthread_equal(pthread_self(), cc->proxy)) {
    atomic_store(&cc->poison_asked, 1);
    return;
  }
  transport_poison_conns(comm, why);
}

static void fail_kernels(struct cuda_comm *cc, ncclResult_t r) {
  __atomic_store_n(&cc->status->abort, 1, __ATOMIC_RELAXED);
  comm_set_error(cc->comm, r);
}

static int kernels_running(struct cuda_comm *cc) {
  return cc->launched && cudaEventQuery(cc->last) == cudaErrorNotReady;
}

/* ", in AllReduce(count 100, float, sum)": the calls of the oldest launch
 * still running, which is where a stalled kernel is. */
static void running_call(struct cuda_comm *cc, char *buf, size_t len) {
  buf[0] = '\0';
  struct arena *oldest = NULL;
  pthread_mutex_lock(&cc->recent_lock);
  /* Every arena: the launching thread may be adding one. launch_no is
   * set, under the lock, only once its event exists. */
  for (int i = 0; i < MAX_ARENAS; i++) {
    struct arena *a = &cc->arenas[i];
    if (a->launch_no && (!oldest || a->launch_no < oldest->launch_no) && cudaEventQuery(a->done) == cudaErrorNotReady)
      oldest = a;
  }
  if (oldest) {
    char d[160];
    slot_describe(&oldest->first, d, sizeof d);
    if (oldest->others > 0)
      snprintf(buf, len, ", in %s and the group's %u other work(s)", d, oldest->others);
    else
      snprintf(buf, len, ", in %s", d);
  }
  pthread_mutex_unlock(&cc->recent_lock);
}

/* A slot waiting on a connection the stalled kernel does not read, from
 * the same collective call by number as one this rank launched but with
 * another description: the ranks' calls differ. */
static ncclResult_t check_crossed(struct cuda_comm *cc, struct conn *c) {
  struct slot_hdr got, want;
  if (!transport_next_hdr(c, &got))
    return ncclSuccess;
  const struct expected *e = &cc->recent[got.seq % MAX_RECENT];
  pthread_mutex_lock(&cc->recent_lock);
  int found = e->set && e->seq == got.seq;
  if (found)
    want = e->want;
  pthread_mutex_unlock(&cc->recent_lock);
  if (!found)
    return ncclSuccess;
  ncclResult_t r = slot_check_crossed(&want, &got, cc->comm->rank, c->peer);
  if (r != ncclSuccess)
    err_context("rank %d, on the GPU", cc->comm->rank);
  return r;
}

/* The kernels stop with r, found on the connection to c->peer: the
 * sentence says where the kernel is. */
static void blame(struct cuda_comm *cc, struct conn *c, ncclResult_t r) {
  char in[224];
  running_call(cc, in, sizeof in);
  err_context("rank %d, on the GPU%s, waiting on rank %d", cc->comm->rank, in, c->peer);
  fail_kernels(cc, r);
}

static void *proxy_main(void *arg) {
  struct cuda_comm *cc = arg;
  struct ncclComm *comm = cc->comm;
  cudaSetDevice(comm->cuda_dev);
  /* Its event queries and peeks would otherwise break a user's capture
   * in the global mode on any thread (they are not captured, only made). */
  cuda_capture_relax();
  log_set_rank(comm->rank);
  place_thread(comm->local_cpus, cc->ignore_affinity);
  struct waiter w;
  wait_init(&w, 0, WAIT_YIELD_NS);
  uint64_t next_check = time_ns(), last_change = time_ns(), seen = 0, seen_activity = 0;
  int reported = 0;
  while (!atomic_load(&cc->stop)) {
    int n = atomic_load_explicit(&cc->nwatch, memory_order_acquire);
    uint64_t before = __atomic_load_n(&cc->status->progress, __ATOMIC_RELAXED);
    /* Once the communicator has failed its connections are poisoned, and
     * a failure first seen on one may wait for its peer's exit: nothing
     * more to move. */
    if (atomic_load_explicit(&comm->async_error, memory_order_relaxed) == ncclSuccess)
      for (int i = 0; i < n && !atomic_load(&cc->stop); i++)
        transport_progress(cc->watch[i]);
    uint64_t now = time_ns();
    if (atomic_load(&cc->draining) && !atomic_load(&cc->drained)) {
      int pending = 0;
      for (int i = 0; i < n; i++)
        pending += !transport_flushed(cc->watch[i]);
      if (pending == 0 || reported)
        atomic_store(&cc->drained, 1);
    }
    poison_now(cc);
    if (now >= next_check && !reported) {
      next_check = now + 100000000ull;
      if (poll_kernel(cc)) {
        reported = 1;
      } else if (comm_aborted(comm)) {
        __atomic_store_n(&cc->status->abort, 1, __ATOMIC_RELAXED);
      }
      /* Only a stalled kernel blames a peer: one that finished its part
       * and exited while this rank had nothing to wait on it for is fine.
       * The kernel does not say which peer it waits on, so a stall on a
       * live peer can still find another one gone; LOOM_TIMEOUT bounds
       * that case too. */
      int draining = atomic_load(&cc->draining);
      int stalled = (kernels_running(cc) || draining) && __atomic_load_n(&cc->status->progress, __ATOMIC_RELAXED) == seen;
      int running = kernels_running(cc);
      int ncr = atomic_load_explicit(&cc->ncrecv, memory_order_acquire);
      for (int i = 0; i < ncr && !reported && stalled && running; i++) {
        /* A network connection's slots arrive only when moved. */
        ncclResult_t r = transport_progress(cc->crecv[i]);
        if (r == ncclSuccess)
          r = check_crossed(cc, cc->crecv[i]);
        if (r != ncclSuccess) {
          fail_kernels(cc, r);
          reported = 1;
        }
      }
      /* A connection's own failure first (a peer that gave up says why
       * there), then peers that are gone. */
      for (int pass = 0; pass < 2 && !reported && stalled; pass++)
        for (int i = 0; i < n && !reported; i++) {
          struct conn *c = cc->watch[i];
          /* Once the kernels are done, only a send still under way needs
           * its peer: one that finished and exited is no failure. */
          if (!running && transport_flushed(c))
            continue;
          ncclResult_t r = pass == 0 ? transport_failed(c) : transport_check(c);
          if (r != ncclSuccess) {
            blame(cc, c, r);
            reported = 1;
          }
        }
      if (!reported) {
        /* Bytes under way on a network link count, though no slot moved. */
        uint64_t p = __atomic_load_n(&cc->status->progress, __ATOMIC_RELAXED), a = 0;
        for (int i = 0; i < n; i++)
          a += transport_activity(cc->watch[i]);
        /* Read at each check: loomCommSetTimeout may change it between
         * calls; LOOM_TIMEOUT is the value read at init (cc->timeout_s). */
        uint64_t set_ns = atomic_load_explicit(&comm->timeout_ns, memory_order_relaxed);
        uint64_t bound_ns = set_ns ? set_ns : (uint64_t)cc->timeout_s * 1000000000ull;
        if (p != seen || a != seen_activity || (!kernels_running(cc) && !draining)) {
          seen = p;
          seen_activity = a;
          last_change = now;
        } else if (now - last_change >= bound_ns) {
          char in[224], bound[TIMEOUT_NAME_LEN];
          running_call(cc, in, sizeof in);
          timeout_name(set_ns, cc->timeout_s, bound, sizeof bound);
          fail_kernels(cc, err_set(ncclRemoteError,
                                   draining ? "rank %d%s: the last sends of the GPU's collectives timed out after %s "
                                              "while the communicator was finalized"
                                            : "rank %d: a collective on the GPU%s timed out after %s with no progress",
                                   comm->rank, draining ? "" : in, bound));
          reported = 1;
        }
      }
    }
    if (__atomic_load_n(&cc->status->progress, __ATOMIC_RELAXED) != before)
      wait_reset(&w);
    else
      wait_pause(&w);
  }
  return NULL;
}

ncclResult_t cuda_comm_init(struct ncclComm *comm) {
  struct cuda_comm *cc;
  CHECK(UTIL_CALLOC(&cc, 1, "the CUDA executor"));
  comm->cuda = cc;
  cc->comm = comm;
  cuda_aux_hold();
  void *dev;
  CHECK(cuda_host_alloc((void **)&cc->status, &dev, sizeof *cc->status, "the kernels' status"));
  cc->status_dev = dev;
  CUDA_TRY(cudaEventCreateWithFlags(&cc->last, cudaEventDisableTiming), "cudaEventCreate");
  cc->watch_cap = 2 * comm->nranks + 2 * LOOM_MAX_CHANNELS;
  CHECK(UTIL_CALLOC(&cc->watch, cc->watch_cap, "watched connections"));
  cc->crecv_cap = 4 * LOOM_MAX_CHANNELS + 64;
  CHECK(UTIL_CALLOC(&cc->crecv, cc->crecv_cap, "collective connections"));
  pthread_mutex_init(&cc->recent_lock, NULL);
  cc->timeout_s = timeout_seconds();
  cc->max_lanes = (unsigned)comm->peers[comm->rank].max_lanes;
  for (int r = 0; r < comm->nranks; r++)
    cc->max_lanes = LOOM_MIN(cc->max_lanes, (unsigned)comm->peers[r].max_lanes);
  cc->ignore_affinity = (int)param_int(P_IGNORE_CPU_AFFINITY);
  int rc = pthread_create(&cc->proxy, NULL, proxy_main, cc);
  if (rc != 0)
    return err_set(ncclSystemError, "cannot start the proxy thread of rank %d: %s", comm->rank, strerror(rc));
  cc->proxy_started = 1;
  comm->poison_conns = cuda_poison_conns;
  /* The launches' memory now, not while a peer's kernel may run (init.c's
   * connect_cuda says why). */
  struct arena *a;
  for (int i = 0; i < CUDA_ARENAS; i++)
    CHECK(cuda_arena_add(cc, 65536, &a));
  return ncclSuccess;
}

/* Stops the kernels and the proxy: the caller's thread then owns the
 * connections. */
static void stop_proxy(struct cuda_comm *cc, int abort) {
  if (abort) {
    __atomic_store_n(&cc->status->abort, 1, __ATOMIC_RELAXED);
    if (cc->launched)
      cudaEventSynchronize(cc->last);
  }
  if (cc->proxy_started) {
    atomic_store(&cc->stop, 1);
    pthread_join(cc->proxy, NULL);
    cc->proxy_started = 0;
  }
  /* Asked for after the proxy's last look. */
  poison_now(cc);
}

void cuda_comm_stop(struct ncclComm *comm) {
  if (comm->cuda && comm->cuda->status)
    stop_proxy(comm->cuda, 1);
}

ncclResult_t cuda_device_lanes(int32_t *lanes) {
  unsigned n = 0;
  int e = cuda_kernel_max_lanes(&n);
  if (e != cudaSuccess)
    return cuda_fail((cudaError_t)e, "asking how many blocks of the kernel the device holds at once");
  *lanes = (int32_t)n;
  return ncclSuccess;
}

ncclResult_t cuda_comm_finalize(struct ncclComm *comm) {
  struct cuda_comm *cc = comm->cuda;
  if (!cc || !cc->proxy_started || atomic_load(&cc->draining))
    return ncclSuccess;
  CHECK(cuda_set_device(comm->cuda_dev));
  /* The proxy keeps running meanwhile: a kernel stuck on a dead peer is
   * stopped by it rather than waited for forever. */
  if (cc->launched)
    cudaEventSynchronize(cc->last);
  /* A kernel is done once its slots are written; over the network they
   * still have to leave, which only the proxy makes them do, and through
   * p2p the peer's kernel has yet to release them (its last write into
   * this rank's memory, which must not be freed before). */
  atomic_store(&cc->draining, 1);
  struct waiter w;
  wait_init(&w, 0, WAIT_YIELD_NS);
  while (!atomic_load(&cc->drained))
    wait_pause(&w);
  return comm->async_error;
}

uint64_t cuda_comm_dev_bytes(const struct ncclComm *comm) {
  const struct cuda_comm *cc = comm->cuda;
  uint64_t n = 0;
  for (int i = 0; cc && i < cc->narenas; i++)
    n += cc->arenas[i].cap;
  for (const struct retired *r = cc ? cc->retired : NULL; r; r = r->next)
    n += r->cap;
  return n;
}

void cuda_comm_fini(struct ncclComm *comm, int abort) {
  struct cuda_comm *cc = comm->cuda;
  if (!cc)
    return;
  cudaSetDevice(comm->cuda_dev);
  if (!abort)
    cuda_comm_finalize(comm);
  if (cc->status)
    stop_proxy(cc, abort);
  for (int i = 0; i < cc->narenas; i++) {
    cudaFreeHost(cc->arenas[i].host);
    cudaFree(cc->arenas[i].dev);
    cudaEventDestroy(cc->arenas[i].done);
  }
  cuda_graph_plans_free();
  for (struct retired *r = cc->retired, *next; r; r = next) {
    next = r->next;
    cudaFreeHost(r->host);
    cudaFree(r->dev);
    free(r);
  }
  if (cc->last)
    cudaEventDestroy(cc->last);
  cuda_host_free(cc->status);
  free(cc->watch);
  free(cc->crecv);
  pthread_mutex_destroy(&cc->recent_lock);
  free(cc);
  cuda_aux_release();
  comm->cuda = NULL;
}

