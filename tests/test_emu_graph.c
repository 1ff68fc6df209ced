/*
 * The emulated CUDA runtime's graphs (docs/emulation.md): a stream capture
 * records, a launch replays, kernel parameters are copied when launched or
 * captured, and user objects go with the last graph or exec holding them.
 * They test the emulation itself, so they run only in loom_tests_emu.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "emu_test.h"

#if LOOM_TEST_EMU

/* What the replayed host function saw: the counter after each launch. */
enum { REPLAYS = 50 };
struct replay_log {
  const int *slot; /* pinned: the copy of the counter the graph made */
  int seen[REPLAYS + 1];
  int n;
};

static void CUDART_CB log_append(void *arg) {
  struct replay_log *log = (struct replay_log *)arg;
  if (log->n <= REPLAYS)
    log->seen[log->n] = *log->slot;
  log->n++;
}

/* A stream of a kernel, two copies, an event and a host function,
 * captured once and launched 50 times, alternately on two streams: the
 * kernel runs 50 times, the copies and the host function after it each
 * time, and each launch after the one before it whatever its stream. */
TEST_IMPL(emu_graph_replay) {
  NEED_GPU();
  cudaStream_t s[2];
  for (int i = 0; i < 2; i++)
    CUDA_OK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
  int *ctr, *mirror, *slot;
  CUDA_OK(cudaMalloc((void **)&ctr, sizeof *ctr));
  CUDA_OK(cudaMalloc((void **)&mirror, sizeof *mirror));
  CUDA_OK(cudaHostAlloc((void **)&slot, sizeof *slot, 0));
  CUDA_OK(cudaMemset(ctr, 0, sizeof *ctr));
  CUDA_OK(cudaDeviceSynchronize());
  *slot = -1;
  struct replay_log log = {slot, {0}, 0};
  cudaEvent_t ev;
  CUDA_OK(cudaEventCreate(&ev));

  CUDA_OK(cudaStreamBeginCapture(s[0], cudaStreamCaptureModeGlobal));
  struct add_params p = {ctr, 1};
  ASSERT(emu_launch_params(s[0], 1, k_add, &p, sizeof p) == cudaSuccess);
  CUDA_OK(cudaMemcpyAsync(mirror, ctr, sizeof *ctr, cudaMemcpyDeviceToDevice, s[0]));
  CUDA_OK(cudaMemcpyAsync(slot, mirror, sizeof *slot, cudaMemcpyDeviceToHost, s[0]));
  CUDA_OK(cudaEventRecord(ev, s[0]));
  CUDA_OK(cudaStreamWaitEvent(s[0], ev, 0)); /* an event of the same capture */
  CUDA_OK(cudaLaunchHostFunc(s[0], log_append, &log));
  enum cudaStreamCaptureStatus st;
  CUDA_OK(cudaStreamIsCapturing(s[0], &st));
  ASSERT(st == cudaStreamCaptureStatusActive);
  unsigned long long id = 0;
  cudaGraph_t during = NULL;
  const cudaGraphNode_t *deps = NULL;
  size_t ndeps = 0;
  CUDA_OK(cudaStreamGetCaptureInfo(s[0], &st, &id, &during, &deps, NULL, &ndeps));
  ASSERT(st == cudaStreamCaptureStatusActive && id != 0 && during != NULL && ndeps == 1 && deps != NULL);
  CUDA_OK(cudaStreamIsCapturing(s[1], &st));
  ASSERT(st == cudaStreamCaptureStatusNone);
  cudaGraph_t graph = NULL;
  CUDA_OK(cudaStreamEndCapture(s[0], &graph));
  ASSERT(graph == during);
  CUDA_OK(cudaStreamIsCapturing(s[0], &st));
  ASSERT(st == cudaStreamCaptureStatusNone);

  /* Nothing ran while it was captured. */
  CUDA_OK(cudaStreamSynchronize(s[0]));
  int v = -1;
  CUDA_OK(cudaMemcpy(&v, ctr, sizeof v, cudaMemcpyDeviceToHost));
  ASSERT_MSG(v == 0 && log.n == 0 && *slot == -1, "the capture ran: counter %d, host function %d times", v, log.n);

  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < REPLAYS; i++)
    CUDA_OK(cudaGraphLaunch(exec, s[i % 2]));
  CUDA_OK(cudaStreamSynchronize(s[0]));
  CUDA_OK(cudaStreamSynchronize(s[1]));
  CUDA_OK(cudaMemcpy(&v, ctr, sizeof v, cudaMemcpyDeviceToHost));
  ASSERT_MSG(v == REPLAYS, "counter %d after %d launches", v, REPLAYS);
  ASSERT_MSG(log.n == REPLAYS, "the host function ran %d times", log.n);
  for (int i = 0; i < REPLAYS; i++)
    ASSERT_MSG(log.seen[i] == i + 1, "launch %d saw the counter at %d", i, log.seen[i]);
  CUDA_OK(cudaEventQuery(ev)); /* recorded by the launches, done */

  /* A second exec of the same graph replays it as well. */
  cudaGraphExec_t exec2;
  CUDA_OK(cudaGraphInstantiateWithFlags(&exec2, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  CUDA_OK(cudaGraphLaunch(exec2, s[1]));
  CUDA_OK(cudaStreamSynchronize(s[1]));
  CUDA_OK(cudaMemcpy(&v, ctr, sizeof v, cudaMemcpyDeviceToHost));
  ASSERT_MSG(v == REPLAYS + 1 && log.n == REPLAYS + 1, "counter %d, host function %d times", v, log.n);

  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphExecDestroy(exec2));
  CUDA_OK(cudaGraphDestroy(graph));
  ASSERT(cudaGraphDestroy(graph) == cudaErrorInvalidValue); /* already gone */
  ASSERT(cudaGraphLaunch(exec, s[0]) == cudaErrorInvalidValue);
  cudaGetLastError();
  cudaFree(ctr);
  cudaFree(mirror);
  cudaFreeHost(slot);
  return 0;
}

/* The kernel of params_set: thread 0 of block 0 stores value, and where
 * its parameters are not as CUDA's (64-byte aligned) it stores -1. */
struct set_params {
  int *out;
  int value;
};

static void k_set(const void *arg) {
  const struct set_params *p = (const struct set_params *)arg;
  const struct emu_thread *t = emu_current();
  if (t->tid.x == 0 && t->bid.x == 0)
    *p->out = (uintptr_t)arg % 64 == 0 ? p->value : -1;
}

/* emu_launch_params copies the parameters when it is called: the caller
 * overwrites them at once, the kernel (held back by a gate) sees the old
 * ones. A capture copies them into the graph: every launch sees them as
 * they were at capture. */
TEST_IMPL(emu_graph_params) {
  NEED_GPU();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *out, *ctr;
  CUDA_OK(cudaMalloc((void **)&out, sizeof *out));
  CUDA_OK(cudaMalloc((void **)&ctr, sizeof *ctr));
  CUDA_OK(cudaMemset(out, 0, sizeof *out));
  CUDA_OK(cudaMemset(ctr, 0, sizeof *ctr));
  CUDA_OK(cudaDeviceSynchronize());

  struct gate g;
  gate_init(&g);
  CUDA_OK(cudaLaunchHostFunc(s, gate_wait, &g));
  struct set_params sp = {out, 7};
  ASSERT(emu_launch_params(s, 3, k_set, &sp, sizeof sp) == cudaSuccess);
  sp.out = NULL; /* a kernel reading the caller's struct would crash */
  sp.value = 99;
  gate_open(&g);
  CUDA_OK(cudaStreamSynchronize(s));
  int v = 0;
  CUDA_OK(cudaMemcpy(&v, out, sizeof v, cudaMemcpyDeviceToHost));
  ASSERT_MSG(v == 7, "the kernel stored %d, launched with 7 (-1: parameters not 64-byte aligned)", v);

  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  struct add_params ap = {ctr, 11};
  ASSERT(emu_launch_params(s, 2, k_add, &ap, sizeof ap) == cudaSuccess);
  ap.ctr = NULL;
  ap.add = 1000;
  cudaGraph_t graph;
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; i++)
    CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(&v, ctr, sizeof v, cudaMemcpyDeviceToHost));
  ASSERT_MSG(v == 3 * 2 * 11, "3 launches of 2 blocks adding 11 made %d", v);

  /* No more than a GPU takes; none at all is fine. */
  static char big[32768];
  ASSERT(emu_launch_params(s, 1, k_set, big, sizeof big) == cudaErrorInvalidValue);
  ASSERT(cudaGetLastError() == cudaErrorInvalidValue);
  ASSERT(emu_launch_params(s, 0, k_set, &sp, sizeof sp) == cudaErrorInvalidConfiguration);
  cudaGetLastError();

  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  cudaFree(out);
  cudaFree(ctr);
  return 0;
}

/* ---- user objects ---- */

struct uo_state {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int runs;              /* the destructor's calls */
  int kernel_done_first; /* the launch holding it had run when it ran */
  const int *kernel_flag;
  pthread_t thread;
  cudaError_t call; /* what a CUDA call inside it returned */
};

static void CUDART_CB uo_destroy(void *arg) {
  struct uo_state *u = (struct uo_state *)arg;
  cudaError_t e = cudaFree(NULL);
  pthread_mutex_lock(&u->mu);
  u->runs++;
  u->thread = pthread_self();
  u->call = e;
  u->kernel_done_first = u->kernel_flag && __atomic_load_n(u->kernel_flag, __ATOMIC_ACQUIRE) != 0;
  pthread_cond_broadcast(&u->cv);
  pthread_mutex_unlock(&u->mu);
}

static void uo_init(struct uo_state *u, const int *kernel_flag) {
  memset(u, 0, sizeof *u);
  pthread_mutex_init(&u->mu, NULL);
  pthread_cond_init(&u->cv, NULL);
  u->kernel_flag = kernel_flag;
}

static int uo_runs(struct uo_state *u) {
  pthread_mutex_lock(&u->mu);
  int n = u->runs;
  pthread_mutex_unlock(&u->mu);
  return n;
}

/* References counted across the caller, a graph and its exec: the
 * destructor runs once, when the last goes, on a thread of the runtime
 * where CUDA calls fail; an exec destroyed while a launch of it is queued
 * keeps its references until that launch has run. */
TEST_IMPL(emu_user_object) {
  NEED_GPU();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *flag;
  CUDA_OK(cudaMalloc((void **)&flag, sizeof *flag));
  CUDA_OK(cudaMemset(flag, 0, sizeof *flag));
  CUDA_OK(cudaDeviceSynchronize());

  /* The caller's own references. */
  struct uo_state a;
  uo_init(&a, NULL);
  cudaUserObject_t oa;
  ASSERT(cudaUserObjectCreate(&oa, &a, uo_destroy, 1, 0) == cudaErrorInvalidValue); /* the flag is required */
  ASSERT(cudaUserObjectCreate(&oa, &a, uo_destroy, 0, cudaUserObjectNoDestructorSync) == cudaErrorInvalidValue);
  cudaGetLastError();
  CUDA_OK(cudaUserObjectCreate(&oa, &a, uo_destroy, 2, cudaUserObjectNoDestructorSync));
  CUDA_OK(cudaUserObjectRelease(oa, 1));
  CUDA_OK(cudaUserObjectRetain(oa, 2));
  CUDA_OK(cudaUserObjectRelease(oa, 2));
  ASSERT_MSG(uo_runs(&a) == 0, "destructor ran with a reference left");
  CUDA_OK(cudaUserObjectRelease(oa, 1));
  ASSERT_MSG(wait_flag(&a.mu, &a.cv, &a.runs, 1, 10), "destructor did not run after the last release");
  ASSERT(!pthread_equal(a.thread, pthread_self()));
  ASSERT_MSG(a.call == cudaErrorNotPermitted, "a CUDA call in the destructor returned %d", (int)a.call);

  /* A graph's and its exec's: moved into the graph, kept by the exec. */
  struct uo_state b;
  uo_init(&b, flag);
  cudaUserObject_t ob;
  CUDA_OK(cudaUserObjectCreate(&ob, &b, uo_destroy, 1, cudaUserObjectNoDestructorSync));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaGraph_t during;
  enum cudaStreamCaptureStatus st;
  CUDA_OK(cudaStreamGetCaptureInfo(s, &st, NULL, &during, NULL, NULL, NULL));
  CUDA_OK(cudaGraphRetainUserObject(during, ob, 1, cudaGraphUserObjectMove));
  CUDA_OK(cudaGraphRetainUserObject(during, ob, 2, 0));
  CUDA_OK(cudaGraphReleaseUserObject(during, ob, 2));
  ASSERT(cudaGraphReleaseUserObject(during, ob, 5) == cudaErrorInvalidValue); /* it holds 1 */
  cudaGetLastError();
  struct set_params sp = {flag, 1};
  ASSERT(emu_launch_params(s, 1, k_set, &sp, sizeof sp) == cudaSuccess);
  cudaGraph_t graph;
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphDestroy(graph));
  ASSERT_MSG(uo_runs(&b) == 0, "destructor ran while the exec holds a reference");

  /* The exec destroyed while its launch waits behind a gate. */
  struct gate g;
  gate_init(&g);
  CUDA_OK(cudaLaunchHostFunc(s, gate_wait, &g));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaGraphExecDestroy(exec));
  /* A bounded look for what must not happen: a destructor released at
   * once would run within this on its own thread. */
  ASSERT_MSG(!wait_flag(&b.mu, &b.cv, &b.runs, 1, 0.3), "destructor ran before the exec's launch had run");
  gate_open(&g);
  ASSERT_MSG(wait_flag(&b.mu, &b.cv, &b.runs, 1, 10), "destructor did not run after the exec and graph went");
  CUDA_OK(cudaStreamSynchronize(s));
  ASSERT(b.kernel_done_first);
  ASSERT_MSG(uo_runs(&a) == 1 && uo_runs(&b) == 1, "destructors ran %d and %d times", uo_runs(&a), uo_runs(&b));

  /* An invalidated capture's graph releases what it held. */
  struct uo_state c;
  uo_init(&c, NULL);
  cudaUserObject_t oc;
  CUDA_OK(cudaUserObjectCreate(&oc, &c, uo_destroy, 1, cudaUserObjectNoDestructorSync));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaStreamGetCaptureInfo(s, &st, NULL, &during, NULL, NULL, NULL));
  CUDA_OK(cudaGraphRetainUserObject(during, oc, 1, cudaGraphUserObjectMove));
  ASSERT(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  ASSERT(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated && graph == NULL);
  cudaGetLastError();
  ASSERT_MSG(wait_flag(&c.mu, &c.cv, &c.runs, 1, 10), "destructor did not run with the invalidated graph");
  cudaFree(flag);
  return 0;
}

#else

NO_EMU(emu_graph_replay)
NO_EMU(emu_graph_params)
NO_EMU(emu_user_object)

#endif
