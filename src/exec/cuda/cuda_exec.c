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
 * whether running kernels have stopped making progress for LOOM_TIMEOUT.
 * Any of these stops the kernels (they poll an abort word) and becomes the
 * communicator's asynchronous error, as NCCL reports it.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"
#include "exec/cuda/cuda_exec.h"
#include "exec/cuda/dev.h"
#include "exec/slot.h"
#include "misc/cudamem.h"
#include "misc/place.h"
#include "misc/utils.h"
#include "transport/transport.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARENAS 8
/* Collectives of recent launches whose headers the proxy compares. */
#define MAX_RECENT 64

/* What a peer's slot for the collective numbered `seq` must say. */
struct expected {
  uint64_t seq;
  struct slot_hdr want;
};

struct arena {
  void *host, *dev;
  size_t cap;
  cudaEvent_t done;
  int used;
  /* For the proxy's sentences, under recent_lock: which launch this is,
   * the header of its first work, and how many works of other calls. */
  uint64_t launch_no;
  struct slot_hdr first;
  uint32_t others;
};

/* Arena memory outgrown: freed with the communicator, never before, since
 * cudaFree waits for every kernel of the device, and one of them may wait
 * for a launch this process has yet to make. */
struct retired {
  void *host, *dev;
  struct retired *next;
};

struct cuda_comm {
  struct ncclComm *comm;
  struct dev_status *status, *status_dev;
  struct arena arenas[MAX_ARENAS];
  int narenas, next_arena;
  struct retired *retired;
  /* What cuda_prepare packed and cuda_launch starts. */
  struct arena *ready;
  size_t ready_size, ready_works, ready_tmpl;
  uint32_t ready_lanes;
  cudaEvent_t last; /* recorded after every launch */
  void *last_stream;
  _Atomic int launched; /* set by launches, read by the proxy */
  unsigned max_lanes; /* resident at once on the device */
  /* Set by finalize: the proxy reports when every connection's sends have
   * left (drained), or why they cannot. */
  _Atomic int draining, drained;
  /* Connections the proxy watches; appended by the launching thread,
   * read by the proxy up to the published count. */
  struct conn **watch;
  int watch_cap;
  _Atomic int nwatch;
  /* The collective connections this rank receives on, published like
   * `watch`, and the headers recent launches expect: a peer that called
   * another collective may write where this rank's kernel never reads,
   * which only the proxy can see. */
  struct conn **crecv;
  int crecv_cap;
  _Atomic int ncrecv;
  pthread_mutex_t recent_lock;
  struct expected recent[MAX_RECENT];
  uint64_t nrecent;
  uint64_t nlaunches;
  struct slot_hdr ready_first; /* cuda_prepare's first work, for its arena */
  uint32_t ready_others;       /* its works of other calls */
  pthread_t proxy;
  int proxy_started;
  _Atomic int stop;
  /* A kernel's mismatch report becomes the error once, whichever thread
   * sees it first (the proxy, or the caller's next call or query). */
  _Atomic int kernel_reported;
  /* The connections the proxy moves are poisoned on its thread only (a
   * network connection's plugin comm is closed by poisoning, and must not
   * be while the proxy is inside it): another thread asks. */
  _Atomic int poison_asked;
  /* LOOM_TIMEOUT, read at init: the proxy thread never reads the
   * environment, which the program may be changing meanwhile (setenv
   * beside getenv can crash). */
  int64_t timeout_s;
  int ignore_affinity; /* NCCL_IGNORE_CPU_AFFINITY, for the same reason */
};

static ncclResult_t cuda_fail(cudaError_t e, const char *what) {
  return err_set(ncclUnhandledCudaError, "%s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CUDA_TRY(call, what)            \
  do {                                  \
    cudaError_t cuda_try_e_ = (call);   \
    if (cuda_try_e_ != cudaSuccess)     \
      return cuda_fail(cuda_try_e_, what); \
  } while (0)

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
  uint64_t tail = 0, head = 0;
  if (cuda_read_u64(c->dev.tail, &tail) != ncclSuccess || cuda_read_u64(c->dev.head, &head) != ncclSuccess ||
      tail <= head)
    return ncclSuccess;
  const char *at = c->dev.hdrs ? c->dev.hdrs + (head % NCCL_STEPS) * SLOT_HDR_BYTES
                               : c->dev.base + (head % NCCL_STEPS) * c->fifo.stride;
  struct slot_hdr got;
  if (cuda_read(&got, at, sizeof got) != ncclSuccess)
    return ncclSuccess;
  int found = 0;
  struct slot_hdr want;
  pthread_mutex_lock(&cc->recent_lock);
  for (int i = 0; i < MAX_RECENT && (uint64_t)i < cc->nrecent && !found; i++)
    if (cc->recent[i].seq == got.seq) {
      want = cc->recent[i].want;
      found = 1;
    }
  pthread_mutex_unlock(&cc->recent_lock);
  if (!found)
    return ncclSuccess;
  want.bytes = got.bytes;
  if (slot_matches(&want, &got, 1))
    return ncclSuccess;
  ncclResult_t r = slot_mismatch(&want, &got, cc->comm->rank, c->peer, 1);
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
  log_set_rank(comm->rank);
  place_thread(comm->local_cpus, cc->ignore_affinity);
  struct waiter w;
  wait_init(&w, 0);
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
        if (p != seen || a != seen_activity || (!kernels_running(cc) && !draining)) {
          seen = p;
          seen_activity = a;
          last_change = now;
        } else if (now - last_change >= (uint64_t)cc->timeout_s * 1000000000ull) {
          char in[224];
          running_call(cc, in, sizeof in);
          fail_kernels(cc, err_set(ncclRemoteError,
                                   draining ? "rank %d%s: the last sends of the GPU's collectives did not leave in "
                                              "LOOM_TIMEOUT=%llds while the communicator was finalized"
                                            : "rank %d: a collective on the GPU%s made no progress for LOOM_TIMEOUT=%llds",
                                   comm->rank, draining ? "" : in, (long long)cc->timeout_s));
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
  int e = cuda_kernel_max_lanes(&cc->max_lanes);
  if (e != cudaSuccess)
    return cuda_fail((cudaError_t)e, "asking how many blocks of the kernel the device holds at once");
  cc->ignore_affinity = (int)param_int(P_IGNORE_CPU_AFFINITY);
  int rc = pthread_create(&cc->proxy, NULL, proxy_main, cc);
  if (rc != 0)
    return err_set(ncclSystemError, "cannot start the proxy thread of rank %d: %s", comm->rank, strerror(rc));
  cc->proxy_started = 1;
  comm->poison_conns = cuda_poison_conns;
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
  wait_init(&w, 0);
  while (!atomic_load(&cc->drained))
    wait_pause(&w);
  return comm->async_error;
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

/* ---- launching ---------------------------------------------------------- */

static ncclResult_t get_arena(struct cuda_comm *cc, size_t size, struct arena **out) {
  for (int i = 0; i < cc->narenas; i++) {
    struct arena *a = &cc->arenas[i];
    if (a->cap >= size && (!a->used || cudaEventQuery(a->done) == cudaSuccess)) {
      *out = a;
      return ncclSuccess;
    }
  }
  struct arena *a;
  if (cc->narenas < MAX_ARENAS) {
    a = &cc->arenas[cc->narenas++];
    CUDA_TRY(cudaEventCreateWithFlags(&a->done, cudaEventDisableTiming), "cudaEventCreate");
  } else {
    /* All in flight: wait for the oldest instead of growing without end. */
    a = &cc->arenas[cc->next_arena];
    cc->next_arena = (cc->next_arena + 1) % MAX_ARENAS;
    CUDA_TRY(cudaEventSynchronize(a->done), "waiting for an earlier launch");
    a->used = 0;
  }
  if (a->cap < size) {
    if (a->host || a->dev) {
      struct retired *r;
      CHECK(UTIL_CALLOC(&r, 1, "an outgrown launch arena"));
      r->host = a->host;
      r->dev = a->dev;
      r->next = cc->retired;
      cc->retired = r;
    }
    /* Doubling bounds what is retired to as much as is in use. */
    size_t cap = LOOM_MAX(LOOM_MAX(size, (size_t)65536), 2 * a->cap);
    a->host = a->dev = NULL;
    a->cap = 0;
    CUDA_TRY(cudaHostAlloc(&a->host, cap, cudaHostAllocDefault), "cudaHostAlloc for a launch");
    CHECK(cuda_malloc(&a->dev, cap, "a launch"));
    a->cap = cap;
  }
  *out = a;
  return ncclSuccess;
}

static void watch(struct cuda_comm *cc, struct conn *c) {
  if (!c || c->proxied)
    return;
  int n = atomic_load(&cc->nwatch);
  if (n >= cc->watch_cap)
    return; /* every connection there can be fits; this cannot happen */
  c->proxied = 1;
  cc->watch[n] = c;
  atomic_store_explicit(&cc->nwatch, n + 1, memory_order_release);
}

static void note_crecv(struct cuda_comm *cc, struct conn *c) {
  if (!c || c->dir != CONN_RECV || c->kind == CONN_P2P || !c->connected || !c->dev.tail || !c->dev.head)
    return;
  int n = atomic_load(&cc->ncrecv);
  for (int i = 0; i < n; i++)
    if (cc->crecv[i] == c)
      return;
  if (n >= cc->crecv_cap)
    return; /* more than rings and trees make; the check just misses it */
  cc->crecv[n] = c;
  atomic_store_explicit(&cc->ncrecv, n + 1, memory_order_release);
}

static void note_expected(struct cuda_comm *cc, const struct work *w, const struct slot_hdr *want) {
  if (w->task->coll == COLL_SEND || w->task->coll == COLL_RECV)
    return;
  pthread_mutex_lock(&cc->recent_lock);
  int known = 0;
  for (int i = 0; i < MAX_RECENT && (uint64_t)i < cc->nrecent && !known; i++)
    known = cc->recent[i].seq == w->seq;
  if (!known) {
    cc->recent[cc->nrecent % MAX_RECENT] = (struct expected){.seq = w->seq, .want = *want};
    cc->nrecent++;
  }
  pthread_mutex_unlock(&cc->recent_lock);
}

static struct dev_conn dev_conn_of(struct conn *c) {
  struct dev_conn d = {0};
  if (!c)
    return d;
  d.base = c->dev.base;
  d.hdrs = c->dev.hdrs;
  d.stride = c->fifo.stride;
  d.tail = c->dev.tail;
  d.head = c->dev.head;
  d.step = c->step;
  d.peer = c->peer;
  return d;
}

/* The slots a work will use on each of its connections: the host keeps
 * the counters, since the next launch is built before this one runs. */
static void advance_steps(const struct work *w) {
  uint64_t sends[WORK_MAX_PEERS] = {0}, recvs[WORK_MAX_PEERS] = {0};
  schedule_slots(&w->sched, w->piece, sends, recvs);
  for (int i = 0; i < w->nsends; i++)
    if (w->sends[i])
      w->sends[i]->step += sends[i];
  for (int i = 0; i < w->nrecvs; i++)
    if (w->recvs[i])
      w->recvs[i]->step += recvs[i];
}

ncclResult_t cuda_prepare(struct ncclComm *comm, struct lane *lanes, int nlanes, void *stream) {
  struct cuda_comm *cc = comm->cuda;
  cc->ready = NULL;
  /* A launch holds the works' step templates, never their expanded
   * steps: its size does not grow with the count. */
  size_t used = 0, nworks = 0, ntmpl = 0;
  for (int l = 0; l < nlanes; l++) {
    if (!lanes[l].head)
      continue;
    used++;
    for (struct work *w = lanes[l].head; w; w = w->next) {
      nworks++;
      ntmpl += w->sched.ntmpl;
    }
  }
  if (used == 0)
    return ncclSuccess;
  /* The lanes of a launch wait on each other and on the peers' lanes:
   * all of them must be on the device at once. */
  if (used > cc->max_lanes)
    return err_set(ncclInvalidUsage,
                   "rank %d: this group needs %zu lanes (thread blocks) running at once, and the device holds only %u "
                   "of Loom's kernel at a time: split the group (fewer peers or channels per group)",
                   comm->rank, used, cc->max_lanes);
  size_t off_lanes = LOOM_ALIGN_UP(sizeof(struct dev_plan), 64);
  size_t off_works = LOOM_ALIGN_UP(off_lanes + used * sizeof(struct dev_lane), 64);
  size_t off_steps = LOOM_ALIGN_UP(off_works + nworks * sizeof(struct dev_work), 64);
  size_t size = off_steps + ntmpl * sizeof(struct step_tmpl);
  CHECK(cuda_set_device(comm->cuda_dev));
  struct arena *a = NULL;
  CHECK(get_arena(cc, size, &a));
  char *h = a->host, *d = a->dev;
  struct dev_plan *plan = (struct dev_plan *)h;
  struct dev_lane *dl = (struct dev_lane *)(h + off_lanes);
  struct dev_work *dw = (struct dev_work *)(h + off_works);
  struct step_tmpl *ds = (struct step_tmpl *)(h + off_steps);
  plan->nlanes = (uint32_t)used;
  plan->nworks = (uint32_t)nworks;
  plan->status = cc->status_dev;
  plan->lanes = (const struct dev_lane *)(d + off_lanes);
  plan->works = (const struct dev_work *)(d + off_works);
  size_t li = 0, wi = 0, ti = 0;
  for (int l = 0; l < nlanes; l++) {
    if (!lanes[l].head)
      continue;
    dl[li].first = (uint32_t)wi;
    dl[li].count = 0;
    for (struct work *w = lanes[l].head; w; w = w->next) {
      struct dev_work *x = &dw[wi++];
      memset(x, 0, sizeof *x);
      const struct task *t = w->task;
      x->src = w->src;
      x->dst = w->dst;
      x->sched = w->sched;
      x->sched.tmpl = (struct step_tmpl *)(d + off_steps) + ti;
      x->sched.cap = w->sched.ntmpl;
      memcpy(ds + ti, w->sched.tmpl, sizeof *ds * (size_t)w->sched.ntmpl);
      ti += w->sched.ntmpl;
      x->esize = (uint32_t)w->esize;
      x->piece = w->piece;
      x->red = t->red;
      x->scalar_dev = t->scalar_dev;
      slot_mine(t, w->seq, comm->rank, &x->mine);
      if (wi == 1) {
        cc->ready_first = x->mine;
        cc->ready_others = 0;
      } else if (!slot_matches(&cc->ready_first, &x->mine, 1)) {
        cc->ready_others++; /* another call, not the first one's other lane */
      }
      slot_expect(t, w->seq, &x->expect);
      note_expected(cc, w, &x->expect);
      x->check_seq = t->coll != COLL_RECV;
      x->nsends = w->nsends;
      x->nrecvs = w->nrecvs;
      for (int i = 0; i < w->nsends; i++) {
        x->sends[i] = dev_conn_of(w->sends[i]);
        watch(cc, w->sends[i]);
      }
      for (int i = 0; i < w->nrecvs; i++) {
        x->recvs[i] = dev_conn_of(w->recvs[i]);
        watch(cc, w->recvs[i]);
      }
      advance_steps(w);
      dl[li].count++;
    }
    li++;
  }
  /* Connected by now, rings and trees alike. */
  for (int ch = 0; ch < comm->nchannels; ch++)
    note_crecv(cc, comm->ring_recv[ch]);
  for (struct conn *c = comm->extra_conns; c; c = c->next_extra)
    note_crecv(cc, c);
  cc->ready = a;
  cc->ready_size = size;
  cc->ready_lanes = (uint32_t)used;
  cc->ready_works = nworks;
  cc->ready_tmpl = ntmpl;
  return ncclSuccess;
}

ncclResult_t cuda_launch(struct ncclComm *comm, void *stream) {
  struct cuda_comm *cc = comm->cuda;
  struct arena *a = cc->ready;
  if (!a)
    return ncclSuccess;
  cc->ready = NULL;
  CHECK(cuda_set_device(comm->cuda_dev));
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e = cudaSuccess;
  /* A communicator's kernels run one after the other, as the host counted
   * their slots: a launch on another stream waits for the one before. */
  if (cc->launched && stream != cc->last_stream)
    e = cudaStreamWaitEvent(s, cc->last, 0);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(a->dev, a->host, cc->ready_size, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess)
    e = (cudaError_t)cuda_kernel_launch((const struct dev_plan *)a->dev, cc->ready_lanes, s);
  pthread_mutex_lock(&cc->recent_lock);
  if (e == cudaSuccess)
    e = cudaEventRecord(a->done, s);
  if (e == cudaSuccess) {
    a->launch_no = ++cc->nlaunches;
    a->first = cc->ready_first;
    a->others = cc->ready_others;
  }
  pthread_mutex_unlock(&cc->recent_lock);
  if (e == cudaSuccess)
    e = cudaEventRecord(cc->last, s);
  if (e != cudaSuccess)
    return cuda_fail(e, "launching the collective kernel");
  a->used = 1;
  cc->launched = 1;
  cc->last_stream = stream;
  TRACE(LOG_COLL, "rank %d: launched %u lane(s), %zu work(s), %zu step template(s) on stream %p", comm->rank,
        cc->ready_lanes, cc->ready_works, cc->ready_tmpl, stream);
  return ncclSuccess;
}
