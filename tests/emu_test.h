/*
 * What the tests of the CUDA emulation itself share (test_emu_graph.c,
 * test_emu_capture.c, test_emu_bar.c): kernels written as C functions
 * (the emulation runs any function as a kernel, emu.h), a gate that holds
 * a stream shut, a wait with a bound, and the stand-in of a test outside
 * the emulated build. (The tests of test_emu_capture.c that call only the
 * CUDA API also build against the real runtime: on a GPU they check that
 * the emulation's rules are CUDA's.)
 */
#ifndef LOOM_EMU_TEST_H
#define LOOM_EMU_TEST_H

#include <pthread.h>
#include <time.h>

#include "gpu_test.h"
#include "test.h"

#define NO_EMU(name) \
  TEST_IMPL(name) { SKIP("tests the CUDA emulation itself: run through loom_tests_emu"); }

#if LOOM_TEST_EMU
#include "exec/cuda/emu/emu.h"

/* The kernel of k_add: thread 0 of each block adds `add` to *ctr. */
struct add_params {
  int *ctr;
  int add;
};

static inline void k_add(const void *arg) {
  const struct add_params *p = (const struct add_params *)arg;
  if (emu_current()->tid.x == 0)
    __atomic_fetch_add(p->ctr, p->add, __ATOMIC_RELAXED);
}
#endif

#if LOOM_TEST_CUDA
/* A host function queued on a stream that holds it until the test opens it. */
struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
};

static inline void CUDART_CB gate_wait(void *arg) {
  struct gate *g = (struct gate *)arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static inline void gate_init(struct gate *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = 0;
}

static inline void gate_open(struct gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Waits until *flag (under mu) is at least want, at most `seconds`: 1 if
 * it is. */
static inline int wait_flag(pthread_mutex_t *mu, pthread_cond_t *cv, const int *flag, int want, double seconds) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  long ns = until.tv_nsec + (long)((seconds - (long)seconds) * 1e9);
  until.tv_sec += (time_t)seconds + ns / 1000000000L;
  until.tv_nsec = ns % 1000000000L;
  pthread_mutex_lock(mu);
  int r = 0;
  while (*flag < want && r == 0)
    r = pthread_cond_timedwait(cv, mu, &until);
  int ok = *flag >= want;
  pthread_mutex_unlock(mu);
  return ok;
}
#endif

#endif
