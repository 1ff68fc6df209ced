/*
 * The emulated CUDA runtime's events, synchronisation, stream capture,
 * graphs and user objects (docs/emulation.md). A capture records the
 * commands issued on its stream into a graph instead of running them;
 * an instantiated graph launched on a stream queues copies of them there,
 * as many times as it is launched. What CUDA's rules say about capture
 * (the programming guide's "prohibited and unhandled operations" and
 * cudaThreadExchangeStreamCaptureMode) is kept, because a library that
 * runs here must also run under a real capture:
 * - A call that is unsafe during a capture (cudaMalloc, cudaHostAlloc,
 *   cudaFree, cudaFreeHost, the synchronous cudaMemcpy, cudaEventQuery and
 *   cudaEventSynchronize) fails with cudaErrorStreamCaptureUnsupported and
 *   invalidates the capture when the calling thread's mode forbids it: a
 *   thread in global mode is forbidden by its own capture (unless begun
 *   relaxed) and by any thread's capture begun in global mode; one in
 *   thread-local mode by its own only; one in relaxed mode by none.
 * - What necessarily conflicts with a capture fails in every mode and
 *   invalidates it: synchronising or querying the capturing stream
 *   (cudaErrorStreamCaptureUnsupported), the device while any of its
 *   streams captures (the same), an event last recorded in the capture
 *   (cudaErrorCapturedEvent), the legacy stream while a blocking stream of
 *   its device captures (cudaErrorStreamCaptureImplicit), waiting in the
 *   capture for an event recorded outside it (cudaErrorStreamCaptureIsolation)
 *   or in another capture (cudaErrorStreamCaptureMerge).
 * - Once invalidated, commands on the stream fail with
 *   cudaErrorStreamCaptureInvalidated, and so does cudaStreamEndCapture,
 *   which ends the capture and gives no graph.
 * A capture is linear (one stream): a wait that would join another stream
 * to it (cudaStreamWaitEvent on an event recorded in it), external event
 * waits and graph launches inside a capture are refused with a line on
 * standard error and cudaErrorStreamCaptureUnsupported.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "exec/cuda/emu/emu_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include <map>
#include <set>

namespace emu {

thread_local bool t_in_destructor = false;

namespace {

/* A user object (cudaUserObjectCreate). Never freed, so that a handle
 * used after its last reference went is caught, not a use after free. */
struct uobj {
  void *ptr;
  cudaHostFn_t destroy;
  uint64_t refs;
  bool dead;
};

struct graph {
  std::deque<op> ops; /* a deque: a node's handle is its op's address */
  std::map<uobj *, uint64_t> refs; /* the user object references it owns */
  capture *cap = nullptr;          /* the capture recording into it */
};

/* The references an executable graph holds: released when both the exec
 * and its last launch have gone (each launch keeps a share until it has
 * run, as CUDA defers an exec's releases until its launches complete). */
struct exec_refs {
  std::map<uobj *, uint64_t> refs;
  ~exec_refs();
};

struct exec {
  std::vector<op> ops;
  std::shared_ptr<exec_refs> refs;
  stream *last = nullptr; /* its latest launch, which the next waits for */
  uint64_t last_count = 0;
};

} // namespace

struct capture {
  uint64_t id;
  stream *origin;
  cudaStreamCaptureMode mode;
  pthread_t thread; /* that began it */
  bool invalid = false;
  graph *g;
  /* What cudaStreamGetCaptureInfo hands out. */
  cudaGraphNode_t last = nullptr;
  cudaGraphEdgeData edge = {};
};

namespace {

/* Capture sequences, graphs, execs and user objects; never held while
 * taking it again (exec_refs' destructor takes it). Taken before g_mu, a
 * stream's mu and g_ev_mu. */
std::mutex g_cap_mu;
std::vector<capture *> g_caps; /* the active ones */
uint64_t g_cap_ids;
std::set<graph *> g_graphs;
std::set<exec *> g_execs;
std::set<uobj *> g_uobjs;
thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

/* ---- user objects' destructors: on a thread of their own, as CUDA runs
 * them on an internal one; a CUDA call there fails (enter()). */

/* Never destroyed: the thread waits on it through exit(), and glibc's
 * pthread_cond_destroy waits for its waiters. */
struct dtor_queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<uobj *> q;
};
dtor_queue *g_dtor = new dtor_queue;

void *dtor_main(void *) {
  t_in_destructor = true;
  for (;;) {
    uobj *o;
    {
      std::unique_lock<std::mutex> l(g_dtor->mu);
      g_dtor->cv.wait(l, [] { return !g_dtor->q.empty(); });
      o = g_dtor->q.front();
      g_dtor->q.pop_front();
    }
    o->destroy(o->ptr);
  }
  return nullptr;
}

void dtor_push(uobj *o) {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_t th;
    if (pthread_create(&th, nullptr, dtor_main, nullptr) != 0) {
      fprintf(stderr, "loom emu: cannot start the user objects' destructor thread\n");
      abort();
    }
    pthread_detach(th);
  });
  std::lock_guard<std::mutex> l(g_dtor->mu);
  g_dtor->q.push_back(o);
  g_dtor->cv.notify_all();
}

/* Under g_cap_mu: a handle that is no user object, or one whose last
 * reference has gone, which on a GPU is a use after free. */
uobj *uobj_check(cudaUserObject_t h, const char *what) {
  uobj *o = (uobj *)h;
  if (!g_uobjs.count(o))
    return nullptr;
  if (o->dead) {
    fprintf(stderr, "loom emu: %s of user object %p, whose last reference was already released\n", what, (void *)o);
    abort();
  }
  return o;
}

/* Under g_cap_mu. */
void uobj_drop(uobj *o, uint64_t n, const char *what) {
  if (n > o->refs) {
    fprintf(stderr, "loom emu: %s of %llu references of user object %p, which has only %llu\n", what,
            (unsigned long long)n, (void *)o, (unsigned long long)o->refs);
    abort();
  }
  o->refs -= n;
  if (o->refs == 0) {
    o->dead = true;
    dtor_push(o);
  }
}

/* Under g_cap_mu: the graph and the references it owns. */
void graph_free(graph *g) {
  for (auto &r : g->refs)
    uobj_drop(r.first, r.second, "cudaGraphDestroy");
  g_graphs.erase(g);
  delete g;
}

/* Under g_cap_mu: the active capture whose id is `id`, if any. */
capture *capture_by_id(uint64_t id) {
  if (id == 0)
    return nullptr;
  for (capture *c : g_caps)
    if (c->id == id)
      return c;
  return nullptr;
}

/* Under g_cap_mu: using the legacy stream s while a blocking stream of
 * its device captures would make the capture wait for it, which CUDA
 * refuses: those captures are invalidated. */
bool implicit_conflict(stream *s) {
  bool hit = false;
  if (s->legacy)
    for (capture *c : g_caps)
      if (c->origin->blocking && c->origin->device == s->device) {
        c->invalid = true;
        hit = true;
      }
  return hit;
}

/* Under g_cap_mu: a call that synchronises or queries s. */
cudaError_t stream_conflict(stream *s) {
  if (s->cap) {
    s->cap->invalid = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  if (implicit_conflict(s))
    return cudaErrorStreamCaptureImplicit;
  return cudaSuccess;
}

/* Under g_cap_mu: a call the emulation does not support in a capture. */
cudaError_t refuse(capture *c, const char *what) {
  fprintf(stderr, "loom emu: %s: not emulated (the emulation's captures are linear, on one stream)\n", what);
  c->invalid = true;
  return cudaErrorStreamCaptureUnsupported;
}

/* An event record run outside a capture: issued now. */
void record_now(op &o) {
  o.ev->captured = 0;
  std::lock_guard<std::mutex> l(g_ev_mu);
  o.gen = ++o.ev->recorded;
}

/* Under g_cap_mu: the capture of an event last recorded in one that is
 * still active, which only that capture's stream may use. */
cudaError_t event_conflict(event *ev) {
  capture *c = capture_by_id(ev->captured);
  if (!c)
    return cudaSuccess;
  c->invalid = true;
  return cudaErrorCapturedEvent;
}

} // namespace

exec_refs::~exec_refs() {
  std::lock_guard<std::mutex> l(g_cap_mu);
  for (auto &r : refs)
    uobj_drop(r.first, r.second, "cudaGraphExecDestroy");
}

cudaError_t submit(stream *s, op o, uint64_t *count) {
  {
    std::lock_guard<std::mutex> l(g_cap_mu);
    if (capture *c = s->cap) {
      if (c->invalid)
        return cudaErrorStreamCaptureInvalidated;
      if (o.kind == OP_RECORD)
        o.ev->captured = c->id;
      o.deps.clear();
      c->g->ops.push_back(std::move(o));
      c->last = (cudaGraphNode_t)&c->g->ops.back();
      if (count)
        *count = 0;
      return cudaSuccess;
    }
    if (implicit_conflict(s))
      return cudaErrorStreamCaptureImplicit;
    if (o.kind == OP_RECORD)
      record_now(o);
  }
  uint64_t n = enqueue(s, std::move(o));
  if (count)
    *count = n;
  return cudaSuccess;
}

cudaError_t capture_unsafe() {
  if (t_mode == cudaStreamCaptureModeRelaxed)
    return cudaSuccess;
  std::lock_guard<std::mutex> l(g_cap_mu);
  pthread_t self = pthread_self();
  bool forbidden = false;
  for (capture *c : g_caps) {
    bool mine = pthread_equal(c->thread, self);
    if ((mine && c->mode != cudaStreamCaptureModeRelaxed) ||
        (!mine && t_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal)) {
      c->invalid = true;
      forbidden = true;
    }
  }
  return forbidden ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

} // namespace emu

using namespace emu;

extern "C" {

/* ---- synchronisation ---- */

static cudaError_t stream_check(stream *s) {
  std::lock_guard<std::mutex> l(g_cap_mu);
  return stream_conflict(s);
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
  ENTER();
  stream *s = resolve(h);
  cudaError_t e = stream_check(s);
  if (e != cudaSuccess)
    return ret(e);
  sync_stream(s);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
  ENTER();
  stream *s = resolve(h);
  cudaError_t e = stream_check(s);
  if (e != cudaSuccess)
    return ret(e);
  std::lock_guard<std::mutex> l(s->mu);
  return s->done >= s->enq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
  ENTER();
  {
    std::lock_guard<std::mutex> l(g_cap_mu);
    bool hit = false;
    for (capture *c : g_caps)
      if (c->origin->device == t_dev) {
        c->invalid = true;
        hit = true;
      }
    if (hit)
      return ret(cudaErrorStreamCaptureUnsupported);
  }
  sync_all();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t e, unsigned int flags) {
  ENTER();
  event *ev = (event *)e;
  if (!ev)
    return ret(cudaErrorInvalidResourceHandle);
  stream *s = resolve(h);
  {
    std::lock_guard<std::mutex> l(g_cap_mu);
    capture *from = capture_by_id(ev->captured);
    if (capture *c = s->cap) {
      if (c->invalid)
        return ret(cudaErrorStreamCaptureInvalidated);
      if (from == c)
        return cudaSuccess; /* recorded earlier on this very stream: in order already */
      if (flags & cudaEventWaitExternal)
        return ret(refuse(c, "cudaStreamWaitEvent with cudaEventWaitExternal in a capture"));
      c->invalid = true;
      return ret(from ? cudaErrorStreamCaptureMerge : cudaErrorStreamCaptureIsolation);
    }
    if (from)
      return ret(refuse(from, "cudaStreamWaitEvent on another stream for an event recorded in a capture "
                              "(a fork of the capture)"));
    if (implicit_conflict(s))
      return ret(cudaErrorStreamCaptureImplicit);
  }
  uint64_t gen;
  {
    std::lock_guard<std::mutex> l(g_ev_mu);
    gen = ev->recorded;
  }
  if (gen == 0)
    return cudaSuccess; /* never recorded: nothing to wait for */
  op o;
  o.kind = OP_WAIT;
  o.ev = ev;
  o.gen = gen;
  enqueue(s, std::move(o));
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *arg) {
  ENTER();
  if (!fn)
    return ret(cudaErrorInvalidValue);
  op o;
  o.kind = OP_HOSTFN;
  o.fn = fn;
  o.dst = arg;
  return ret(submit(resolve(h), std::move(o)));
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  ENTER();
  *e = (cudaEvent_t) new event; /* never freed: a queued record may still name it */
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  ENTER();
  return e ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t h) {
  ENTER();
  if (!e)
    return ret(cudaErrorInvalidResourceHandle);
  op o;
  o.kind = OP_RECORD;
  o.ev = (event *)e;
  return ret(submit(resolve(h), std::move(o)));
}

/* The checks of cudaEventQuery and cudaEventSynchronize. */
static cudaError_t event_check(event *ev) {
  if (!ev)
    return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> l(g_cap_mu);
    cudaError_t e = event_conflict(ev);
    if (e != cudaSuccess)
      return e;
  }
  return capture_unsafe();
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  ENTER();
  event *ev = (event *)e;
  cudaError_t r = event_check(ev);
  if (r != cudaSuccess)
    return ret(r);
  std::lock_guard<std::mutex> l(g_ev_mu);
  return ev->done >= ev->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  ENTER();
  event *ev = (event *)e;
  cudaError_t r = event_check(ev);
  if (r != cudaSuccess)
    return ret(r);
  std::unique_lock<std::mutex> l(g_ev_mu);
  uint64_t want = ev->recorded;
  g_ev_cv.wait(l, [&] { return ev->done >= want; });
  return cudaSuccess;
}

/* ---- stream capture ---- */

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  ENTER();
  if (!mode || (unsigned)*mode > cudaStreamCaptureModeRelaxed)
    return ret(cudaErrorInvalidValue);
  cudaStreamCaptureMode old = t_mode;
  t_mode = *mode;
  *mode = old;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode mode) {
  ENTER();
  if ((unsigned)mode > cudaStreamCaptureModeRelaxed)
    return ret(cudaErrorInvalidValue);
  stream *s = resolve(h);
  if (s->legacy)
    return ret(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> l(g_cap_mu);
  if (s->cap)
    return ret(cudaErrorIllegalState);
  capture *c = new capture;
  c->id = ++g_cap_ids;
  c->origin = s;
  c->mode = mode;
  c->thread = pthread_self();
  c->g = new graph;
  c->g->cap = c;
  g_graphs.insert(c->g);
  g_caps.push_back(c);
  s->cap = c;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *out) {
  ENTER();
  if (!out)
    return ret(cudaErrorInvalidValue);
  stream *s = resolve(h);
  std::lock_guard<std::mutex> l(g_cap_mu);
  capture *c = s->cap;
  if (!c)
    return ret(cudaErrorIllegalState);
  if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self()))
    return ret(cudaErrorStreamCaptureWrongThread);
  s->cap = nullptr;
  for (size_t i = 0; i < g_caps.size(); i++)
    if (g_caps[i] == c) {
      g_caps.erase(g_caps.begin() + (long)i);
      break;
    }
  graph *g = c->g;
  g->cap = nullptr;
  bool invalid = c->invalid;
  delete c;
  if (invalid) {
    graph_free(g); /* and with it the references it owned */
    *out = nullptr;
    return ret(cudaErrorStreamCaptureInvalidated);
  }
  *out = (cudaGraph_t)g;
  return cudaSuccess;
}

/* The legacy stream while a blocking stream of its device captures:
 * its status is not defined, and the capture goes on. */
static bool implicit_query(stream *s) {
  if (s->legacy)
    for (capture *c : g_caps)
      if (c->origin->blocking && c->origin->device == s->device)
        return true;
  return false;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t h, enum cudaStreamCaptureStatus *status) {
  ENTER();
  if (!status)
    return ret(cudaErrorInvalidValue);
  stream *s = resolve(h);
  std::lock_guard<std::mutex> l(g_cap_mu);
  if (implicit_query(s))
    return ret(cudaErrorStreamCaptureImplicit);
  *status = !s->cap           ? cudaStreamCaptureStatusNone
            : s->cap->invalid ? cudaStreamCaptureStatusInvalidated
                              : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t h, enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                     cudaGraph_t *graph_out, const cudaGraphNode_t **deps,
                                     const cudaGraphEdgeData **edges, size_t *ndeps) {
  ENTER();
  if (!status || (edges && !deps))
    return ret(cudaErrorInvalidValue);
  stream *s = resolve(h);
  std::lock_guard<std::mutex> l(g_cap_mu);
  if (implicit_query(s))
    return ret(cudaErrorStreamCaptureImplicit);
  capture *c = s->cap;
  if (!c) {
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  *status = c->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  if (id)
    *id = c->id;
  if (graph_out)
    *graph_out = (cudaGraph_t)c->g;
  /* Linear: the next node depends on the last one captured, if any. */
  bool any = !c->g->ops.empty();
  if (deps)
    *deps = any ? &c->last : nullptr;
  if (edges)
    *edges = any ? &c->edge : nullptr;
  if (ndeps)
    *ndeps = any ? 1 : 0;
  return cudaSuccess;
}

/* ---- graphs ---- */

cudaError_t cudaGraphCreate(cudaGraph_t *out, unsigned int flags) {
  ENTER();
  if (!out || flags != 0)
    return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(g_cap_mu);
  graph *g = new graph;
  g_graphs.insert(g);
  *out = (cudaGraph_t)g;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t h) {
  ENTER();
  std::lock_guard<std::mutex> l(g_cap_mu);
  graph *g = (graph *)h;
  if (!g_graphs.count(g))
    return ret(cudaErrorInvalidValue);
  if (g->cap)
    return ret(cudaErrorIllegalState); /* a capture still records into it */
  graph_free(g);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *out, cudaGraph_t h, unsigned long long flags) {
  ENTER();
  /* Nothing to free on launch (no memory nodes), nothing to upload, one
   * priority: those flags change nothing here. */
  const unsigned long long ok = cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload |
                                cudaGraphInstantiateFlagUseNodePriority;
  if (flags & cudaGraphInstantiateFlagDeviceLaunch) {
    fprintf(stderr, "loom emu: cudaGraphInstantiateFlagDeviceLaunch: not emulated\n");
    return ret(cudaErrorInvalidValue);
  }
  if (!out || (flags & ~ok))
    return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(g_cap_mu);
  graph *g = (graph *)h;
  if (!g_graphs.count(g))
    return ret(cudaErrorInvalidValue);
  exec *x = new exec;
  x->ops.assign(g->ops.begin(), g->ops.end());
  x->refs = std::make_shared<exec_refs>();
  for (auto &r : g->refs) {
    r.first->refs += r.second;
    x->refs->refs[r.first] += r.second;
  }
  g_execs.insert(x);
  *out = (cudaGraphExec_t)x;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t h, unsigned long long flags) {
  return cudaGraphInstantiateWithFlags(out, h, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t h, cudaStream_t sh) {
  ENTER();
  stream *s = resolve(sh);
  std::lock_guard<std::mutex> l(g_cap_mu);
  exec *x = (exec *)h;
  if (!g_execs.count(x))
    return ret(cudaErrorInvalidValue);
  if (capture *c = s->cap) {
    if (c->invalid)
      return ret(cudaErrorStreamCaptureInvalidated);
    return ret(refuse(c, "cudaGraphLaunch into a stream being captured (a child graph)"));
  }
  if (implicit_conflict(s))
    return ret(cudaErrorStreamCaptureImplicit);
  /* The commands in order behind the exec's previous launch, then a
   * command that keeps the exec's references until they have run. */
  bool first = true;
  uint64_t n = 0;
  for (const op &from : x->ops) {
    op o = from;
    if (first && x->last && x->last != s)
      o.deps.push_back({x->last, x->last_count});
    first = false;
    if (o.kind == OP_RECORD)
      record_now(o);
    n = enqueue(s, std::move(o));
  }
  if (!x->ops.empty()) {
    op keep;
    keep.kind = OP_TASK;
    std::shared_ptr<exec_refs> refs = x->refs;
    keep.task = [refs] {};
    n = enqueue(s, std::move(keep));
    x->last = s;
    x->last_count = n;
  }
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t h) {
  ENTER();
  std::shared_ptr<exec_refs> refs;
  {
    std::lock_guard<std::mutex> l(g_cap_mu);
    exec *x = (exec *)h;
    if (!g_execs.count(x))
      return ret(cudaErrorInvalidValue);
    g_execs.erase(x);
    refs = std::move(x->refs);
    delete x;
  }
  refs.reset(); /* released now if no launch still holds them */
  return cudaSuccess;
}

/* ---- user objects ---- */

cudaError_t cudaUserObjectCreate(cudaUserObject_t *out, void *ptr, cudaHostFn_t destroy, unsigned int initial,
                                 unsigned int flags) {
  ENTER();
  if (!out || !destroy || initial == 0 || initial > INT_MAX || flags != cudaUserObjectNoDestructorSync)
    return ret(cudaErrorInvalidValue);
  uobj *o = new uobj{ptr, destroy, initial, false};
  std::lock_guard<std::mutex> l(g_cap_mu);
  g_uobjs.insert(o);
  *out = (cudaUserObject_t)o;
  return cudaSuccess;
}

/* What the calls on a user object check first, under g_cap_mu. */
static cudaError_t uobj_arg(cudaUserObject_t h, unsigned int count, const char *what, uobj **o) {
  if (count == 0 || count > INT_MAX)
    return cudaErrorInvalidValue;
  *o = uobj_check(h, what);
  return *o ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaUserObjectRetain(cudaUserObject_t h, unsigned int count) {
  ENTER();
  std::lock_guard<std::mutex> l(g_cap_mu);
  uobj *o;
  cudaError_t e = uobj_arg(h, count, "cudaUserObjectRetain", &o);
  if (e == cudaSuccess)
    o->refs += count;
  return ret(e);
}

cudaError_t cudaUserObjectRelease(cudaUserObject_t h, unsigned int count) {
  ENTER();
  std::lock_guard<std::mutex> l(g_cap_mu);
  uobj *o;
  cudaError_t e = uobj_arg(h, count, "cudaUserObjectRelease", &o);
  if (e == cudaSuccess)
    uobj_drop(o, count, "cudaUserObjectRelease");
  return ret(e);
}

cudaError_t cudaGraphRetainUserObject(cudaGraph_t gh, cudaUserObject_t h, unsigned int count, unsigned int flags) {
  ENTER();
  std::lock_guard<std::mutex> l(g_cap_mu);
  graph *g = (graph *)gh;
  uobj *o;
  cudaError_t e = uobj_arg(h, count, "cudaGraphRetainUserObject", &o);
  if (e != cudaSuccess || !g_graphs.count(g) || (flags & ~(unsigned)cudaGraphUserObjectMove))
    return ret(cudaErrorInvalidValue);
  if (!(flags & cudaGraphUserObjectMove))
    o->refs += count; /* moved: the caller's references become the graph's */
  g->refs[o] += count;
  return cudaSuccess;
}

cudaError_t cudaGraphReleaseUserObject(cudaGraph_t gh, cudaUserObject_t h, unsigned int count) {
  ENTER();
  std::lock_guard<std::mutex> l(g_cap_mu);
  graph *g = (graph *)gh;
  uobj *o;
  cudaError_t e = uobj_arg(h, count, "cudaGraphReleaseUserObject", &o);
  if (e != cudaSuccess || !g_graphs.count(g))
    return ret(cudaErrorInvalidValue);
  auto it = g->refs.find(o);
  if (it == g->refs.end() || it->second < count)
    return ret(cudaErrorInvalidValue); /* more than the graph owns */
  if ((it->second -= count) == 0)
    g->refs.erase(it);
  uobj_drop(o, count, "cudaGraphReleaseUserObject");
  return cudaSuccess;
}

} /* extern "C" */
