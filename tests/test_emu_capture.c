/*
 * The emulated CUDA runtime's stream capture rules (docs/emulation.md),
 * as CUDA states them: which calls a capture forbids to which thread in
 * which mode, what conflicts with a capture in every mode, and that a
 * forbidden call invalidates the capture. Also the sequence a library
 * uses to allocate and fill memory while the caller's stream captures
 * (relaxed mode, a private stream) and to free it with the graph. They
 * test the emulation itself and run in loom_tests_emu; those that call
 * only the CUDA API also build against the real runtime, where on a GPU
 * (`loom_tests emu_capture_unsafe`) they check that the emulation's rules
 * are CUDA's, and skip without one.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "emu_test.h"

#if LOOM_TEST_CUDA

/* EndCapture of a capture that must have been invalidated. */
static int end_invalidated(cudaStream_t s) {
  cudaGraph_t g = (cudaGraph_t)&g;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  RASSERT(e == cudaErrorStreamCaptureInvalidated && g == NULL, "cudaStreamEndCapture: %s, graph %p",
          cudaGetErrorName(e), (void *)g);
  cudaGetLastError();
  return 0;
}

static int end_valid(cudaStream_t s) {
  cudaGraph_t g = NULL;
  CUDA_OK(cudaStreamEndCapture(s, &g));
  RASSERT(g != NULL, "no graph");
  CUDA_OK(cudaGraphDestroy(g));
  return 0;
}

static enum cudaStreamCaptureStatus status_of(cudaStream_t s) {
  enum cudaStreamCaptureStatus st = (enum cudaStreamCaptureStatus)-1;
  cudaStreamIsCapturing(s, &st);
  return st;
}

/* The capturing thread's own unsafe calls: refused and invalidating in
 * global and thread-local mode, allowed when the capture began relaxed or
 * the thread is in relaxed mode. */
TEST_IMPL(emu_capture_unsafe) {
  NEED_GPU();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *d;
  CUDA_OK(cudaMalloc((void **)&d, 64));
  void *p = NULL;

  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  ASSERT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  ASSERT(cudaMalloc(&p, 64) == cudaErrorStreamCaptureUnsupported);
  ASSERT(cudaGetLastError() == cudaErrorStreamCaptureUnsupported);
  ASSERT(status_of(s) == cudaStreamCaptureStatusInvalidated);
  ASSERT(cudaMemsetAsync(d, 0, 64, s) == cudaErrorStreamCaptureInvalidated);
  ASSERT(end_invalidated(s) == 0);
  ASSERT(status_of(s) == cudaStreamCaptureStatusNone);

  /* Each unsafe call. */
  int host = 0;
  for (int which = 0; which < 6; which++) {
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t e = cudaSuccess;
    cudaEvent_t ev;
    CUDA_OK(cudaEventCreate(&ev)); /* never recorded: only the rule refuses it */
    switch (which) {
    case 0: e = cudaMalloc(&p, 64); break;
    case 1: e = cudaHostAlloc(&p, 64, 0); break;
    case 2: e = cudaFree(NULL); break;
    case 3: e = cudaMemcpy(&host, d, sizeof host, cudaMemcpyDeviceToHost); break;
    case 4: e = cudaEventQuery(ev); break;
    case 5: e = cudaEventSynchronize(ev); break;
    }
    ASSERT_MSG(e == cudaErrorStreamCaptureUnsupported, "unsafe call %d returned %s", which, cudaGetErrorName(e));
    ASSERT(end_invalidated(s) == 0);
    cudaEventDestroy(ev);
  }

  /* A capture begun relaxed forbids nothing. */
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CUDA_OK(cudaMalloc(&p, 64));
  CUDA_OK(cudaFree(p));
  ASSERT(status_of(s) == cudaStreamCaptureStatusActive);
  ASSERT(end_valid(s) == 0);

  /* Nor does one to a thread in relaxed mode. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaThreadExchangeStreamCaptureMode(&mode));
  ASSERT(mode == cudaStreamCaptureModeGlobal);
  CUDA_OK(cudaMalloc(&p, 64));
  CUDA_OK(cudaMemcpy(p, d, 64, cudaMemcpyDeviceToDevice)); /* s is non-blocking: the legacy stream is free */
  CUDA_OK(cudaFree(p));
  CUDA_OK(cudaThreadExchangeStreamCaptureMode(&mode));
  ASSERT(mode == cudaStreamCaptureModeRelaxed);
  ASSERT(end_valid(s) == 0);
  mode = (enum cudaStreamCaptureMode)7;
  ASSERT(cudaThreadExchangeStreamCaptureMode(&mode) == cudaErrorInvalidValue);
  cudaGetLastError();
  cudaFree(d);
  return 0;
}

/* What conflicts with a capture in every mode, even relaxed: the
 * capturing stream synchronised or queried, the device synchronised, an
 * event recorded in the capture queried, an event from outside waited
 * for, the legacy stream while a blocking stream captures; and a capture
 * not begun relaxed ended from another thread. */
struct end_arg {
  cudaStream_t s;
  cudaError_t e;
};

static void *end_elsewhere(void *p) {
  struct end_arg *a = (struct end_arg *)p;
  cudaGraph_t g;
  a->e = cudaStreamEndCapture(a->s, &g);
  if (a->e == cudaSuccess)
    cudaGraphDestroy(g);
  return NULL;
}

TEST_IMPL(emu_capture_conflicts) {
  NEED_GPU();
  cudaStream_t s, sb, other;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreate(&sb)); /* blocking: the legacy stream waits for it */
  int *d;
  CUDA_OK(cudaMalloc((void **)&d, 64));
  cudaEvent_t inside, outside;
  CUDA_OK(cudaEventCreate(&inside));
  CUDA_OK(cudaEventCreate(&outside));
  CUDA_OK(cudaEventRecord(outside, other));
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CUDA_OK(cudaThreadExchangeStreamCaptureMode(&mode));

  /* Case 6, a fork of the capture to another stream, is CUDA's to do and
   * the emulation's to refuse. */
#if LOOM_TEST_EMU
  int cases = 7;
#else
  int cases = 6;
#endif
  for (int which = 0; which < cases; which++) {
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CUDA_OK(cudaEventRecord(inside, s));
    cudaError_t e = cudaSuccess, want = cudaErrorStreamCaptureUnsupported;
    switch (which) {
    case 0: e = cudaStreamSynchronize(s); break;
    case 1: e = cudaStreamQuery(s); break;
    case 2: e = cudaDeviceSynchronize(); break;
    case 3: e = cudaEventQuery(inside), want = cudaErrorCapturedEvent; break;
    case 4: e = cudaEventSynchronize(inside), want = cudaErrorCapturedEvent; break;
    case 5: e = cudaStreamWaitEvent(s, outside, 0), want = cudaErrorStreamCaptureIsolation; break;
    case 6: /* a fork of the capture to another stream: not emulated */
      e = cudaStreamWaitEvent(other, inside, 0);
      break;
    }
    ASSERT_MSG(e == want, "conflict %d returned %s, not %s", which, cudaGetErrorName(e), cudaGetErrorName(want));
    ASSERT(end_invalidated(s) == 0);
  }
  /* After the capture the event is an ordinary one again. */
  CUDA_OK(cudaEventQuery(inside));
  CUDA_OK(cudaStreamWaitEvent(s, outside, 0));
  CUDA_OK(cudaStreamSynchronize(s));

  /* The legacy stream while a blocking stream captures. */
  CUDA_OK(cudaStreamBeginCapture(sb, cudaStreamCaptureModeRelaxed));
  enum cudaStreamCaptureStatus st;
  ASSERT(cudaStreamIsCapturing(0, &st) == cudaErrorStreamCaptureImplicit);
  ASSERT(status_of(sb) == cudaStreamCaptureStatusActive); /* a query does not invalidate */
  int host = 0;
  ASSERT(cudaMemcpy(&host, d, sizeof host, cudaMemcpyDeviceToHost) == cudaErrorStreamCaptureImplicit);
  ASSERT(status_of(sb) == cudaStreamCaptureStatusInvalidated);
  ASSERT(end_invalidated(sb) == 0);
  /* ... and a non-blocking one does not involve it. */
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CUDA_OK(cudaMemcpy(&host, d, sizeof host, cudaMemcpyDeviceToHost));
  ASSERT(end_valid(s) == 0);

  /* Ended on another thread: refused unless begun relaxed. */
  CUDA_OK(cudaThreadExchangeStreamCaptureMode(&mode));
  for (int relaxed = 0; relaxed < 2; relaxed++) {
    CUDA_OK(cudaStreamBeginCapture(s, relaxed ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeGlobal));
    struct end_arg a = {s, cudaSuccess};
    pthread_t th;
    ASSERT(pthread_create(&th, NULL, end_elsewhere, &a) == 0);
    pthread_join(th, NULL);
    if (relaxed) {
      ASSERT_MSG(a.e == cudaSuccess, "%s", cudaGetErrorName(a.e));
      ASSERT(status_of(s) == cudaStreamCaptureStatusNone);
    } else {
      ASSERT_MSG(a.e == cudaErrorStreamCaptureWrongThread, "%s", cudaGetErrorName(a.e));
      ASSERT(end_valid(s) == 0);
    }
  }
  ASSERT(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();
  cudaFree(d);
  return 0;
}

/* ---- other threads, and a library's allocation during a capture ---- */

struct other_call {
  enum cudaStreamCaptureMode mode; /* the thread's */
  cudaError_t e;
};

static void *malloc_elsewhere(void *p) {
  struct other_call *c = (struct other_call *)p;
  enum cudaStreamCaptureMode m = c->mode;
  cudaThreadExchangeStreamCaptureMode(&m);
  void *q = NULL;
  c->e = cudaMalloc(&q, 64);
  if (c->e == cudaSuccess)
    cudaFree(q);
  return NULL;
}

static cudaError_t malloc_on_thread(enum cudaStreamCaptureMode mode) {
  struct other_call c = {mode, cudaErrorUnknown};
  pthread_t th;
  if (pthread_create(&th, NULL, malloc_elsewhere, &c) != 0)
    return cudaErrorUnknown;
  pthread_join(th, NULL);
  return c.e;
}

/* A capture begun in global mode forbids unsafe calls to every thread in
 * global mode; one begun thread-local, only to its own thread; a thread in
 * thread-local or relaxed mode is forbidden none but its own. */
TEST_IMPL(emu_capture_threads) {
  NEED_GPU();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  ASSERT(malloc_on_thread(cudaStreamCaptureModeRelaxed) == cudaSuccess);
  ASSERT(malloc_on_thread(cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  ASSERT(status_of(s) == cudaStreamCaptureStatusActive);
  ASSERT(malloc_on_thread(cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  ASSERT(status_of(s) == cudaStreamCaptureStatusInvalidated);
  ASSERT(end_invalidated(s) == 0);

  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  ASSERT(malloc_on_thread(cudaStreamCaptureModeGlobal) == cudaSuccess);
  ASSERT(end_valid(s) == 0);
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  ASSERT(malloc_on_thread(cudaStreamCaptureModeGlobal) == cudaSuccess);
  ASSERT(end_valid(s) == 0);
  return 0;
}

#if LOOM_TEST_EMU
/* The kernel of relaxed_alloc: thread 0 of block 0 adds up n ints. */
struct sum_params {
  const int *src;
  int n;
  int *out;
};

static void k_sum(const void *arg) {
  const struct sum_params *p = (const struct sum_params *)arg;
  const struct emu_thread *t = emu_current();
  if (t->tid.x != 0 || t->bid.x != 0)
    return;
  int sum = 0;
  for (int i = 0; i < p->n; i++)
    sum += p->src[i];
  *p->out += sum;
}

struct freed {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int runs;
  void *ptr; /* for the test to free: no CUDA call in a destructor */
};

static void CUDART_CB freed_destroy(void *arg) {
  struct freed *f = (struct freed *)arg;
  pthread_mutex_lock(&f->mu);
  f->runs++;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

/* What a library does when called on a stream being captured in global
 * mode, from the capturing thread or another one: finds the capture and
 * its graph, switches to relaxed mode, allocates, fills the memory
 * through a private non-blocking stream it synchronises, switches back,
 * and hands the memory to the graph through a user object; the capture
 * stays valid, and the graph's launches read the memory. */
struct lib_arg {
  cudaStream_t s; /* capturing */
  int *out;
  struct freed *f;
  int rc;
};

enum { LIB_N = 100 };

static int lib_call(struct lib_arg *a) {
  enum cudaStreamCaptureStatus st;
  cudaGraph_t graph = NULL;
  unsigned long long id = 0;
  CUDA_OK(cudaStreamGetCaptureInfo(a->s, &st, &id, &graph, NULL, NULL, NULL));
  RASSERT(st == cudaStreamCaptureStatusActive && graph != NULL, "status %d", (int)st);
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CUDA_OK(cudaThreadExchangeStreamCaptureMode(&mode));
  int *buf;
  CUDA_OK(cudaMalloc((void **)&buf, LIB_N * sizeof *buf));
  cudaStream_t priv;
  CUDA_OK(cudaStreamCreateWithFlags(&priv, cudaStreamNonBlocking));
  static int src[LIB_N];
  for (int i = 0; i < LIB_N; i++)
    src[i] = i + 1;
  CUDA_OK(cudaMemcpyAsync(buf, src, sizeof src, cudaMemcpyHostToDevice, priv));
  CUDA_OK(cudaStreamSynchronize(priv));
  CUDA_OK(cudaStreamDestroy(priv));
  CUDA_OK(cudaThreadExchangeStreamCaptureMode(&mode));
  cudaUserObject_t obj;
  a->f->ptr = buf;
  CUDA_OK(cudaUserObjectCreate(&obj, a->f, freed_destroy, 1, cudaUserObjectNoDestructorSync));
  CUDA_OK(cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove));
  struct sum_params sp = {buf, LIB_N, a->out};
  RASSERT(emu_launch_params(a->s, 1, k_sum, &sp, sizeof sp) == cudaSuccess, "launch");
  return 0;
}

static void *lib_call_thread(void *p) {
  struct lib_arg *a = (struct lib_arg *)p;
  a->rc = lib_call(a);
  return NULL;
}

TEST_IMPL(emu_capture_relaxed_alloc) {
  NEED_GPU();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *out;
  CUDA_OK(cudaMalloc((void **)&out, sizeof *out));
  for (int elsewhere = 0; elsewhere < 2; elsewhere++) {
    CUDA_OK(cudaMemset(out, 0, sizeof *out));
    CUDA_OK(cudaDeviceSynchronize());
    struct freed f = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, NULL};
    struct lib_arg a = {s, out, &f, 1};
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    if (elsewhere) {
      pthread_t th;
      ASSERT(pthread_create(&th, NULL, lib_call_thread, &a) == 0);
      pthread_join(th, NULL);
    } else {
      a.rc = lib_call(&a);
    }
    ASSERT_MSG(a.rc == 0, "the library's sequence failed (%s)", elsewhere ? "another thread" : "capturing thread");
    ASSERT_MSG(status_of(s) == cudaStreamCaptureStatusActive, "the library's sequence invalidated the capture");
    cudaGraph_t graph;
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
    for (int i = 0; i < 2; i++)
      CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    int v = 0;
    CUDA_OK(cudaMemcpy(&v, out, sizeof v, cudaMemcpyDeviceToHost));
    ASSERT_MSG(v == 2 * LIB_N * (LIB_N + 1) / 2, "two launches summed %d", v);
    ASSERT(f.runs == 0);
    CUDA_OK(cudaGraphExecDestroy(exec));
    ASSERT_MSG(wait_flag(&f.mu, &f.cv, &f.runs, 1, 10), "the memory's destructor did not run");
    CUDA_OK(cudaFree(f.ptr));
  }
  cudaFree(out);
  return 0;
}

#else
NO_EMU(emu_capture_relaxed_alloc)
#endif

#else

NO_EMU(emu_capture_unsafe)
NO_EMU(emu_capture_conflicts)
NO_EMU(emu_capture_threads)
NO_EMU(emu_capture_relaxed_alloc)

#endif
