/*
 * The launching half of the CUDA executor: a group's works on a CUDA
 * communicator are packed (lanes, works, step templates) into device
 * arenas through pinned twins, then started as one kernel per launch on
 * the caller's stream, one block per lane. A group needing more lanes
 * than the device holds at once runs as several launches, split alike on
 * every rank (batch_of).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"
#include "exec/cuda/cuda_comm.h"
#include "exec/cuda/cuda_exec.h"
#include "exec/cuda/dev.h"
#include "exec/slot.h"
#include "misc/cudamem.h"
#include "misc/utils.h"
#include "transport/transport.h"

#include <stdlib.h>
#include <string.h>

/* Retires a's memory (freed with the communicator: cudaFree waits for
 * every kernel of the device, one of which may wait for a launch this
 * process has yet to make) and gives it at least `size` bytes. */
static ncclResult_t arena_grow(struct cuda_comm *cc, struct arena *a, size_t size) {
  if (a->host || a->dev) {
    struct retired *r;
    CHECK(UTIL_CALLOC(&r, 1, "an outgrown launch arena"));
    r->host = a->host;
    r->dev = a->dev;
    r->cap = a->cap;
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
  return ncclSuccess;
}

ncclResult_t cuda_arena_add(struct cuda_comm *cc, size_t size, struct arena **out) {
  if (cc->narenas == MAX_ARENAS)
    return err_set(ncclInternalError, "rank %d: more than %d launches in one group", cc->comm->rank, MAX_ARENAS);
  struct arena *a = &cc->arenas[cc->narenas];
  CUDA_TRY(cudaEventCreateWithFlags(&a->done, cudaEventDisableTiming), "cudaEventCreate");
  cc->narenas++;
  CHECK(arena_grow(cc, a, size));
  *out = a;
  return ncclSuccess;
}

ncclResult_t cuda_arena_get(struct cuda_comm *cc, size_t size, struct arena **out) {
  /* A free one, else the oldest in flight, waited for: no new memory
   * while kernels may run (CUDA_ARENAS were made at init), since an
   * allocation keeps later kernels from starting until earlier ones end,
   * and a peer's earlier kernel may wait for this rank's next. */
  struct arena *oldest = NULL;
  for (int i = 0; i < cc->narenas; i++) {
    struct arena *a = &cc->arenas[i];
    if (a->reserved)
      continue;
    if (!a->used || cudaEventQuery(a->done) == cudaSuccess) {
      a->used = 0;
      oldest = a;
      break;
    }
    if (!oldest || a->launch_no < oldest->launch_no)
      oldest = a;
  }
  if (!oldest)
    /* Every one is reserved by this group's earlier launches. */
    return cuda_arena_add(cc, size, out);
  if (oldest->used) {
    CUDA_TRY(cudaEventSynchronize(oldest->done), "waiting for an earlier launch");
    oldest->used = 0;
  }
  /* Growing is an allocation: a group larger than any before. */
  if (oldest->cap < size)
    CHECK(arena_grow(cc, oldest, size));
  *out = oldest;
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
  if (!c || c->dir != CONN_RECV || c->kind == CONN_P2P || !c->connected || c->crossed_watch)
    return;
  int n = atomic_load(&cc->ncrecv);
  if (n >= cc->crecv_cap)
    return; /* more than rings and trees make; the check just misses it */
  c->crossed_watch = 1;
  cc->crecv[n] = c;
  atomic_store_explicit(&cc->ncrecv, n + 1, memory_order_release);
}

/* Collectives are numbered one after the other, so the last MAX_RECENT
 * have a place each. */
static void note_expected(struct cuda_comm *cc, const struct work *w, const struct slot_hdr *want) {
  if (w->task->coll == COLL_SEND || w->task->coll == COLL_RECV)
    return;
  struct expected *e = &cc->recent[w->seq % MAX_RECENT];
  pthread_mutex_lock(&cc->recent_lock);
  if (!e->set || e->seq != w->seq)
    *e = (struct expected){.seq = w->seq, .want = *want, .set = 1};
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

/* Which launch of the group a lane goes in. The lanes of one launch wait
 * on each other and on the peers' lanes, so they must all be resident at
 * once, and a lane's partner on the peer must be in the same launch: the
 * collectives' channel lanes and the self copy go in the first, and each
 * point-to-point lane by its round, the distance k to its peer along the
 * ring of ranks (a send to rank + k is received by that rank from its
 * rank - k, in the same round there). Every rank counts the rounds a
 * launch takes from the same numbers (the fewest resident blocks of any
 * rank's device, the channel count, whether the group has collectives),
 * so they split alike. -1 where one launch cannot hold what it must. */
static int batch_of(const struct ncclComm *comm, unsigned max_lanes, int colls, int lane) {
  int nch = comm->nchannels, n = comm->nranks, me = comm->rank;
  if (lane < nch)
    return 0;
  int send = lane < nch + n, peer = send ? lane - nch : lane - nch - n;
  int k = send ? (peer - me + n) % n : (me - peer + n) % n;
  if (k == 0)
    return 0;
  /* The first launch keeps room for the channels and the self copy. */
  int first = ((int)max_lanes - (colls ? nch : 0) - 1) / 2, later = (int)max_lanes / 2;
  if (k <= first)
    return 0;
  if (later < 1)
    return -1;
  return 1 + (k - first - 1) / later;
}

/* Packs the lanes of batch b into an arena, reserved until launched. */
static ncclResult_t pack(struct ncclComm *comm, struct lane *lanes, int nlanes, const int8_t *in, int b,
                         struct batch *out) {
  struct cuda_comm *cc = comm->cuda;
  /* A launch holds the works' step templates, never their expanded
   * steps: its size does not grow with the count. */
  size_t used = 0, nworks = 0, ntmpl = 0;
  for (int l = 0; l < nlanes; l++) {
    if (!lanes[l].head || in[l] != b)
      continue;
    used++;
    for (struct work *w = lanes[l].head; w; w = w->next) {
      nworks++;
      ntmpl += w->sched.ntmpl;
    }
  }
  memset(out, 0, sizeof *out);
  if (used == 0)
    return ncclSuccess;
  size_t off_lanes = LOOM_ALIGN_UP(sizeof(struct dev_plan), 64);
  size_t off_works = LOOM_ALIGN_UP(off_lanes + used * sizeof(struct dev_lane), 64);
  size_t off_steps = LOOM_ALIGN_UP(off_works + nworks * sizeof(struct dev_work), 64);
  size_t size = off_steps + ntmpl * sizeof(struct step_tmpl);
  struct arena *a = NULL;
  CHECK(cuda_arena_get(cc, size, &a));
  a->reserved = 1;
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
    if (!lanes[l].head || in[l] != b)
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
      if (wi == 1)
        out->first = x->mine;
      else if (!slot_matches(&out->first, &x->mine, 1))
        out->others++; /* another call, not the first one's other lane */
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
  out->a = a;
  out->size = size;
  out->lanes = (uint32_t)used;
  out->works = nworks;
  out->tmpl = ntmpl;
  return ncclSuccess;
}

ncclResult_t cuda_prepare(struct ncclComm *comm, struct lane *lanes, int nlanes, void *stream) {
  struct cuda_comm *cc = comm->cuda;
  cc->nready = 0;
  int8_t few[256], *in = few;
  if (nlanes > (int)sizeof few)
    CHECK(UTIL_CALLOC(&in, (size_t)nlanes, "the launches of a group"));
  int colls = 0, nbatches = 0;
  for (int l = 0; l < comm->nchannels && l < nlanes; l++)
    colls |= lanes[l].head != NULL;
  ncclResult_t r = ncclSuccess;
  for (int l = 0; l < nlanes && r == ncclSuccess; l++) {
    in[l] = -1;
    if (!lanes[l].head)
      continue;
    int b = batch_of(comm, cc->max_lanes, colls, l);
    const char *why = b < 0                                                           ? "a point-to-point round needs 2"
                      : b >= MAX_BATCHES                                              ? "it would take too many launches"
                      : colls && (unsigned)comm->nchannels + 1 > cc->max_lanes ? "its collectives' channels need more"
                                                                                      : NULL;
    if (why)
      r = err_set(ncclInvalidUsage,
                  "the smallest device of the communicator holds %u thread blocks of Loom's kernel at once, "
                  "and this group cannot run within that (%s): split the group (fewer peers or channels per group)",
                  cc->max_lanes, why);
    in[l] = (int8_t)b;
    nbatches = LOOM_MAX(nbatches, b + 1);
  }
  if (r == ncclSuccess)
    r = cuda_set_device(comm->cuda_dev);
  /* Every launch's memory before the first starts (cuda_exec.h says why). */
  for (int b = 0; b < nbatches && r == ncclSuccess; b++) {
    r = pack(comm, lanes, nlanes, in, b, &cc->ready[cc->nready]);
    if (r == ncclSuccess && cc->ready[cc->nready].a)
      cc->nready++;
  }
  if (in != few)
    free(in);
  if (r != ncclSuccess) {
    for (int i = 0; i < cc->nready; i++)
      cc->ready[i].a->reserved = 0;
    cc->nready = 0;
    return r;
  }
  if (nbatches > 1)
    INFO(LOG_COLL, "rank %d: the group runs as %d launches of at most %u lanes (the blocks resident at once)",
         comm->rank, cc->nready, cc->max_lanes);
  /* Connected by now, rings and trees alike. */
  for (int ch = 0; ch < comm->nchannels; ch++)
    note_crecv(cc, comm->ring_recv[ch]);
  for (struct conn *c = comm->extra_conns; c; c = c->next_extra)
    note_crecv(cc, c);
  return ncclSuccess;
}

static ncclResult_t launch_one(struct ncclComm *comm, struct batch *b, cudaStream_t s) {
  struct cuda_comm *cc = comm->cuda;
  struct arena *a = b->a;
  a->reserved = 0;
  cudaError_t e = cudaSuccess;
  /* A communicator's kernels run one after the other, as the host counted
   * their slots: a launch on another stream waits for the one before. */
  if (cc->launched && (void *)s != cc->last_stream)
    e = cudaStreamWaitEvent(s, cc->last, 0);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(a->dev, a->host, b->size, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess)
    e = (cudaError_t)cuda_kernel_launch((const struct dev_plan *)a->dev, b->lanes, s);
  pthread_mutex_lock(&cc->recent_lock);
  if (e == cudaSuccess)
    e = cudaEventRecord(a->done, s);
  if (e == cudaSuccess) {
    a->launch_no = ++cc->nlaunches;
    a->first = b->first;
    a->others = b->others;
  }
  pthread_mutex_unlock(&cc->recent_lock);
  if (e == cudaSuccess)
    e = cudaEventRecord(cc->last, s);
  if (e != cudaSuccess)
    return cuda_fail(e, "launching the collective kernel");
  a->used = 1;
  cc->launched = 1;
  cc->last_stream = (void *)s;
  TRACE(LOG_COLL, "rank %d: launched %u lane(s), %zu work(s), %zu step template(s) on stream %p", comm->rank,
        b->lanes, b->works, b->tmpl, (void *)s);
  return ncclSuccess;
}

ncclResult_t cuda_launch(struct ncclComm *comm, void *stream) {
  struct cuda_comm *cc = comm->cuda;
  if (cc->nready == 0)
    return ncclSuccess;
  ncclResult_t r = cuda_set_device(comm->cuda_dev);
  int i = 0;
  for (; i < cc->nready && r == ncclSuccess; i++)
    r = launch_one(comm, &cc->ready[i], (cudaStream_t)stream);
  for (; i < cc->nready; i++)
    cc->ready[i].a->reserved = 0;
  cc->nready = 0;
  return r;
}
