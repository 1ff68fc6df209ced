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
  /* Size 0: a launch whose plan is in its parameters needs only the event. */
  if (size > 0)
    CHECK(arena_grow(cc, a, size));
  *out = a;
  return ncclSuccess;
}

ncclResult_t cuda_arena_get(struct cuda_comm *cc, size_t size, struct arena **out) {
  /* A free one, else the oldest in flight, waited for: no new memory
   * while kernels may run (CUDA_ARENAS were made at init), since an
   * allocation keeps later kernels from starting until earlier ones end,
   * and a peer's earlier kernel may wait for this rank's next. A launch
   * with its plan in its parameters takes any, and one with no memory
   * (an event is no allocation) rather than wait: many small calls may
   * be in flight. */
  struct arena *oldest = NULL, *found = NULL;
  for (int i = 0; i < cc->narenas && !found; i++) {
    struct arena *a = &cc->arenas[i];
    if (a->reserved || (size > 0 && a->cap == 0))
      continue;
    if (!a->used || cudaEventQuery(a->done) == cudaSuccess) {
      a->used = 0;
      found = a;
    } else if (!oldest || a->launch_no < oldest->launch_no) {
      oldest = a;
    }
  }
  if (found)
    oldest = found;
  else if (!oldest || (size == 0 && cc->narenas < MAX_ARENAS - MAX_BATCHES))
    /* Every one is reserved by this group's earlier launches, or a small
     * launch takes a new event. */
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
  d.ll = c->dev.ll;
  d.stride = c->fifo.stride;
  d.tail = c->dev.tail;
  d.head = c->dev.head;
  d.step = c->dev.step;
  d.peer = c->peer;
  return d;
}

/* Where a launch's plan puts each part: offsets from its start, aligned
 * for the 8-byte fields the kernel reads. */
struct plan_layout {
  size_t works, conns, tmpl, size;
};

static void plan_layout(size_t nlanes, size_t nworks, size_t nconns, size_t ntmpl, struct plan_layout *l) {
  l->works = LOOM_ALIGN_UP(nlanes * sizeof(struct dev_lane), 16);
  l->conns = LOOM_ALIGN_UP(l->works + nworks * sizeof(struct dev_work), 16);
  l->tmpl = LOOM_ALIGN_UP(l->conns + nconns * sizeof(struct dev_conn), 16);
  l->size = l->tmpl + ntmpl * sizeof(struct step_tmpl);
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

/* Packs the lanes of batch b: into the kernel's parameters where the plan
 * fits there, else into an arena (reserved until launched) or, for a
 * launch a CUDA graph captures, into host memory of its own that the
 * launch copies to device memory the graph keeps (graph_plan). */
static ncclResult_t pack(struct ncclComm *comm, struct lane *lanes, int nlanes, const int8_t *in, int b,
                         int capturing, struct batch *out) {
  struct cuda_comm *cc = comm->cuda;
  /* A launch holds the works' step templates, never their expanded
   * steps: its size does not grow with the count. */
  size_t used = 0, nworks = 0, nconns = 0, ntmpl = 0;
  for (int l = 0; l < nlanes; l++) {
    if (!lanes[l].head || in[l] != b)
      continue;
    used++;
    for (struct work *w = lanes[l].head; w; w = w->next) {
      nworks++;
      nconns += (size_t)(w->nsends + w->nrecvs);
      ntmpl += w->sched.ntmpl;
    }
  }
  memset(out, 0, offsetof(struct batch, params));
  if (used == 0)
    return ncclSuccess;
  struct plan_layout lay;
  plan_layout(used, nworks, nconns, ntmpl, &lay);
  if (lay.size > UINT32_MAX)
    return err_set(ncclInvalidUsage, "rank %d: a group of %zu works is more than one launch can describe", comm->rank,
                   nworks);
  char *h = out->params.inline_plan;
  if (lay.size > DEV_INLINE_BYTES && capturing) {
    CHECK(UTIL_CALLOC(&out->captured, lay.size, "a launch's plan for a CUDA graph"));
    h = out->captured;
  } else if (lay.size > DEV_INLINE_BYTES) {
    CHECK(cuda_arena_get(cc, lay.size, &out->a));
    h = out->a->host;
  } else if (!capturing) {
    /* Only for its event and the proxy's sentences: nothing is copied. */
    CHECK(cuda_arena_get(cc, 0, &out->a));
  }
  if (out->a)
    out->a->reserved = 1;
  struct dev_plan *plan = &out->params.hdr;
  memset(plan, 0, sizeof *plan);
  plan->nlanes = (uint32_t)used;
  plan->nworks = (uint32_t)nworks;
  plan->status = cc->status_dev;
  plan->lanes_off = 0;
  plan->works_off = (uint32_t)lay.works;
  plan->conns_off = (uint32_t)lay.conns;
  plan->size = (uint32_t)lay.size;
  struct dev_lane *dl = (struct dev_lane *)h;
  struct dev_work *dw = (struct dev_work *)(h + lay.works);
  struct dev_conn *dc = (struct dev_conn *)(h + lay.conns);
  struct step_tmpl *ds = (struct step_tmpl *)(h + lay.tmpl);
  size_t li = 0, wi = 0, ti = 0, ci = 0;
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
      x->sched.tmpl = NULL;
      x->sched.cap = w->sched.ntmpl;
      x->tmpl_off = (uint32_t)(lay.tmpl + ti * sizeof *ds);
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
      x->proto = (uint32_t)w->proto;
      x->nsends = w->nsends;
      x->nrecvs = w->nrecvs;
      x->conn0 = (uint32_t)ci;
      for (int i = 0; i < w->nsends + w->nrecvs; i++) {
        struct conn *c = i < w->nsends ? w->sends[i] : w->recvs[i - w->nsends];
        /* The kernels keep a connection's count as they go (dev_conn.step):
         * two blocks of one launch on one connection would both start
         * from the same count. The lanes are built so that it cannot be. */
        if (c && c->packed_in == cc->npacked + 1 && c->packed_lane != (int)li)
          return err_set(ncclInternalError, "rank %d: two lanes of one launch use the connection to rank %d",
                         comm->rank, c->peer);
        /* The tuner chooses LL only where every connection has LL slots
         * (one host, shm or p2p); a connection without is a bug, which
         * must not become a kernel polling where nobody writes. */
        if (c && w->proto == PROTO_LL && !c->dev.ll)
          return err_set(ncclInternalError, "rank %d: an LL work uses the connection to rank %d, which has no LL slots",
                         comm->rank, c->peer);
        if (c) {
          c->packed_in = cc->npacked + 1;
          c->packed_lane = (int)li;
        }
        dc[ci++] = dev_conn_of(c);
        watch(cc, c);
      }
      dl[li].count++;
    }
    li++;
  }
  cc->npacked++;
  out->size = lay.size;
  out->lanes = (uint32_t)used;
  out->works = nworks;
  out->tmpl = ntmpl;
  return ncclSuccess;
}

/* Lets go of what a packed launch holds that will not be launched. */
static void unpack(struct batch *b) {
  if (b->a)
    b->a->reserved = 0;
  free(b->captured);
  b->a = NULL;
  b->captured = NULL;
}

ncclResult_t cuda_prepare(struct ncclComm *comm, struct lane *lanes, int nlanes, void *stream) {
  struct cuda_comm *cc = comm->cuda;
  cc->nready = 0;
  /* At the group's end: the stream's capture may have begun or broken
   * since the calls were queued. */
  CHECK(cuda_stream_capturing(stream, "the group's launch", comm->rank, &cc->capturing));
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
    struct batch *bt = &cc->ready[cc->nready];
    r = pack(comm, lanes, nlanes, in, b, cc->capturing, bt);
    if (r != ncclSuccess)
      unpack(bt);
    else if (bt->lanes)
      cc->nready++;
  }
  if (in != few)
    free(in);
  if (r != ncclSuccess) {
    for (int i = 0; i < cc->nready; i++)
      unpack(&cc->ready[i]);
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

/* The device memory a captured launch's plan lives in, as long as the
 * graph does: a graph keeps its kernels' parameters, not what they point
 * to. CUDA forbids its calls in a user object's destructor, so the memory
 * is handed to a list that the next communicator torn down frees. */
struct graph_plan {
  void *dev;
  struct graph_plan *next;
};
static pthread_mutex_t graph_plans_lock = PTHREAD_MUTEX_INITIALIZER;
static struct graph_plan *graph_plans_done;

static void graph_plan_release(void *p) {
  struct graph_plan *g = p;
  pthread_mutex_lock(&graph_plans_lock);
  g->next = graph_plans_done;
  graph_plans_done = g;
  pthread_mutex_unlock(&graph_plans_lock);
}

void cuda_graph_plans_free(void) {
  pthread_mutex_lock(&graph_plans_lock);
  struct graph_plan *g = graph_plans_done;
  graph_plans_done = NULL;
  pthread_mutex_unlock(&graph_plans_lock);
  for (struct graph_plan *next; g; g = next) {
    next = g->next;
    cudaFree(g->dev);
    free(g);
  }
}

/* Copies a captured launch's plan into device memory the graph owns.
 * Allocating and copying are not allowed on a capturing thread in the
 * default capture mode: this thread is relaxed for them, and the copy
 * runs on a stream of its own, outside the capture. */
#if !GPURT_USER_OBJECTS
static ncclResult_t graph_plan(struct ncclComm *comm, struct batch *b, cudaStream_t s) {
  return err_set(ncclInvalidUsage, "rank %d: a captured launch's plan (%zu bytes) is too big for the kernel's "
                 "parameters and must live as long as the graph, which needs graph user objects: this HIP (%d.%d) has "
                 "none (5.3 added them). Capture fewer calls per group, or build Loom against HIP 5.3 or later",
                 comm->rank, b->size, HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
  (void)graph_plan_release;
  (void)s;
}
#else
static ncclResult_t graph_plan(struct ncclComm *comm, struct batch *b, cudaStream_t s) {
  enum cudaStreamCaptureStatus cs;
  cudaGraph_t graph = NULL;
  /* CUDA 13 added the edges' data to its arguments. */
#if CUDART_VERSION >= 13000
  CUDA_TRY(cudaStreamGetCaptureInfo(s, &cs, NULL, &graph, NULL, NULL, NULL), "cudaStreamGetCaptureInfo");
#else
  CUDA_TRY(cudaStreamGetCaptureInfo(s, &cs, NULL, &graph, NULL, NULL), "cudaStreamGetCaptureInfo");
#endif
  struct graph_plan *g;
  CHECK(UTIL_CALLOC(&g, 1, "a CUDA graph's launch plan"));
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode);
  cudaStream_t copy = NULL;
  cudaUserObject_t obj = NULL;
  if (e == cudaSuccess) {
    e = cudaMalloc(&g->dev, b->size);
    if (e == cudaSuccess)
      e = cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(g->dev, b->captured, b->size, cudaMemcpyHostToDevice, copy);
    if (e == cudaSuccess)
      e = cudaStreamSynchronize(copy);
    if (copy)
      cudaStreamDestroy(copy);
    cudaThreadExchangeStreamCaptureMode(&mode);
  }
  if (e == cudaSuccess)
    e = cudaUserObjectCreate(&obj, g, graph_plan_release, 1, cudaUserObjectNoDestructorSync);
  if (e != cudaSuccess) {
    if (g->dev)
      graph_plan_release(g);
    else
      free(g);
    return cuda_fail(e, "keeping a captured launch's plan for its CUDA graph");
  }
  /* From here the graph owns it, and frees it when it goes. */
  e = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove);
  if (e != cudaSuccess) {
    cudaUserObjectRelease(obj, 1);
    return cuda_fail(e, "cudaGraphRetainUserObject");
  }
  b->params.hdr.plan = g->dev;
  TRACE(LOG_COLL, "rank %d: a captured launch's plan (%zu bytes) kept at %p for its graph", comm->rank, b->size,
        g->dev);
  return ncclSuccess;
}
#endif

/* A launch inside a stream capture: the graph records the kernel and its
 * parameters, nothing else. No event is recorded for the proxy: a replay
 * runs outside every call, when the graph is launched, so the proxy's
 * stall checks do not see it (the kernels still stop on an abort). */
static ncclResult_t launch_captured(struct ncclComm *comm, struct batch *b, cudaStream_t s) {
  if (b->captured) {
    ncclResult_t r = graph_plan(comm, b, s);
    free(b->captured);
    b->captured = NULL;
    CHECK(r);
  }
  cudaError_t e = (cudaError_t)cuda_kernel_launch(&b->params, b->lanes, s);
  if (e != cudaSuccess)
    return cuda_fail(e, "capturing the collective kernel into a CUDA graph");
  TRACE(LOG_COLL, "rank %d: captured %u lane(s), %zu work(s) on stream %p", comm->rank, b->lanes, b->works,
        (void *)s);
  return ncclSuccess;
}

static ncclResult_t launch_one(struct ncclComm *comm, struct batch *b, cudaStream_t s) {
  struct cuda_comm *cc = comm->cuda;
  if (cc->capturing)
    return launch_captured(comm, b, s);
  struct arena *a = b->a;
  a->reserved = 0;
  cudaError_t e = cudaSuccess;
  /* A communicator's kernels run one after the other, each going on from
   * the slot counts the last one left: a launch on another stream waits
   * for the one before. */
  if (cc->launched && (void *)s != cc->last_stream)
    e = cudaStreamWaitEvent(s, cc->last, 0);
  /* A plan too big for the kernel's parameters goes to device memory first. */
  if (e == cudaSuccess && b->size > DEV_INLINE_BYTES) {
    e = cudaMemcpyAsync(a->dev, a->host, b->size, cudaMemcpyHostToDevice, s);
    b->params.hdr.plan = a->dev;
  }
  if (e == cudaSuccess)
    e = (cudaError_t)cuda_kernel_launch(&b->params, b->lanes, s);
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
  TRACE(LOG_COLL, "rank %d: launched %u lane(s), %zu work(s), %zu step template(s) (%zu bytes, %s) on stream %p",
        comm->rank, b->lanes, b->works, b->tmpl, b->size, b->size > DEV_INLINE_BYTES ? "copied" : "in the parameters",
        (void *)s);
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
    unpack(&cc->ready[i]);
  cc->nready = 0;
  return r;
}
