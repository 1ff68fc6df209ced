/*
 * The emulated grid's named barriers and yield (emu_bar_sync,
 * emu_bar_arrive, emu_yield; docs/emulation.md), for kernels whose warps
 * do different work: a producer group and a consumer group of one block
 * hand slots to each other through named barriers, after the consumers
 * spun on a flag a producer sets; and each misuse that would hang a GPU
 * (a barrier no thread can complete, counts that disagree) stops the
 * process with a line saying so. They test the emulation itself, so they
 * run only in loom_tests_emu.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emu_test.h"

#if LOOM_TEST_EMU

enum { SLOTS = 2, ITERS = 200, WIDTH = 64, BLOCKS = 6 };
/* Barrier ids: a slot is full (FULL + slot), empty (EMPTY + slot); the
 * producers' own (PRODUCERS); 0 is __syncthreads'. */
enum { FULL = 1, EMPTY = 3, PRODUCERS = 7 };

struct pipe_params {
  int *errors; /* wrong values the consumers read */
  int *spins;  /* consumers that had to give way to see the flag */
};

/* Shared memory: a block is one OS thread. */
static _Thread_local int pipe_data[SLOTS][WIDTH];
static _Thread_local int go_flag;

/* The first third (and one) of the block produces, the rest consumes:
 * counts computed from blockDim.x, as a kernel does. */
static void k_pipe(const void *arg) {
  const struct pipe_params *p = (const struct pipe_params *)arg;
  const struct emu_thread *t = emu_current();
  unsigned n = t->bdim.x, np = n / 3 + 1, tid = t->tid.x;
  int producer = tid < np;
  if (tid == 0)
    __atomic_store_n(&go_flag, 0, __ATOMIC_RELAXED);
  emu_bar_sync(0, n);
  /* The consumers wait on a flag, giving way: without that the producer
   * that sets it would never run. */
  if (producer) {
    emu_bar_sync(PRODUCERS, np);
    if (tid == 0)
      __atomic_store_n(&go_flag, 1, __ATOMIC_RELEASE);
  } else {
    int spun = 0;
    while (!__atomic_load_n(&go_flag, __ATOMIC_ACQUIRE)) {
      spun = 1;
      emu_yield();
    }
    if (spun)
      __atomic_fetch_add(p->spins, 1, __ATOMIC_RELAXED);
  }
  for (int i = 0; i < ITERS; i++) {
    int slot = i % SLOTS;
    if (producer) {
      if (i >= SLOTS)
        emu_bar_sync(EMPTY + slot, n);
      for (unsigned j = tid; j < WIDTH; j += np)
        pipe_data[slot][j] = i * 1000 + (int)j;
      emu_bar_arrive(FULL + slot, n);
    } else {
      emu_bar_sync(FULL + slot, n);
      for (unsigned j = tid - np; j < WIDTH; j += n - np)
        if (pipe_data[slot][j] != i * 1000 + (int)j)
          __atomic_fetch_add(p->errors, 1, __ATOMIC_RELAXED);
      if (i + SLOTS < ITERS)
        emu_bar_arrive(EMPTY + slot, n);
    }
  }
}

TEST_IMPL(emu_bar_pipeline) {
  NEED_GPU();
  int *counts;
  CUDA_OK(cudaMalloc((void **)&counts, 2 * sizeof *counts));
  CUDA_OK(cudaMemset(counts, 0, 2 * sizeof *counts));
  struct pipe_params p = {counts, counts + 1};
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT(emu_launch_params(s, BLOCKS, k_pipe, &p, sizeof p) == cudaSuccess);
  CUDA_OK(cudaStreamSynchronize(s));
  int h[2];
  CUDA_OK(cudaMemcpy(h, counts, sizeof h, cudaMemcpyDeviceToHost));
  ASSERT_MSG(h[0] == 0, "the consumers read %d wrong values", h[0]);
  const char *env = getenv("LOOM_EMU_THREADS");
  int threads = env ? atoi(env) : 32;
  if (threads >= 2) /* one thread is a producer alone, its barriers of 1 */
    ASSERT_MSG(h[1] > 0, "no consumer had to give way: the test did not test emu_yield");
  cudaFree(counts);
  return 0;
}

/* ---- misuse, each in a child process that must abort with its line ---- */

static void k_lonely(const void *arg) { /* thread 0 leaves the others at barrier 1 */
  const struct emu_thread *t = emu_current();
  if (t->tid.x != 0)
    emu_bar_sync(1, t->bdim.x);
}

static void k_crossed(const void *arg) { /* each half waits for the other at its own barrier */
  const struct emu_thread *t = emu_current();
  emu_bar_sync(t->tid.x < t->bdim.x / 2 ? 1 : 2, t->bdim.x);
}

static void k_counts(const void *arg) { /* the threads disagree on the count */
  const struct emu_thread *t = emu_current();
  emu_bar_sync(3, t->bdim.x - t->tid.x % 2);
}

static void k_ended(const void *arg) { /* thread 0 ends, the others __syncthreads */
  const struct emu_thread *t = emu_current();
  if (t->tid.x != 0)
    emu_bar_sync(0, t->bdim.x);
}

static void k_too_many(const void *arg) { emu_bar_arrive(1, emu_current()->bdim.x + 1); }

static void k_bad_id(const void *arg) { emu_bar_sync(16, emu_current()->bdim.x); }

struct misuse {
  emu_kernel_fn kernel;
  const char *want[3];
};

static const struct misuse misuses[] = {
    {k_lonely, {"loom emu: block 0: deadlock", "(1 of 4 threads ended)", "barrier 1: 3 of 4 arrived"}},
    {k_crossed, {"loom emu: block 0: deadlock", "barrier 1: 2 of 4 arrived", "barrier 2: 2 of 4 arrived"}},
    {k_counts, {"barrier 3 with a count of", "but the threads before it said", NULL}},
    {k_ended, {"loom emu: block 0: 1 of 4 threads ended while the others wait at __syncthreads", NULL, NULL}},
    {k_too_many, {"barrier 1 with a count of 5, but the block has 4 threads", NULL, NULL}},
    {k_bad_id, {"emu_bar_sync(16, ...): barriers are 0 to 15", NULL, NULL}},
};

/* The child: a block of 4 threads runs the kernel; it must not return. */
static void misuse_child(emu_kernel_fn kernel) {
  struct rlimit none = {0, 0};
  setrlimit(RLIMIT_CORE, &none);
  setenv("LOOM_EMU_THREADS", "4", 1);
  if (emu_launch(NULL, 1, kernel, NULL) == cudaSuccess)
    cudaDeviceSynchronize();
  fprintf(stderr, "the kernel returned\n");
  _exit(0);
}

TEST_IMPL(emu_bar_deadlock) {
  NEED_GPU();
  for (size_t i = 0; i < sizeof misuses / sizeof misuses[0]; i++) {
    int fds[2];
    ASSERT(pipe(fds) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      dup2(fds[1], 2);
      misuse_child(misuses[i].kernel);
    }
    close(fds[1]);
    char out[4096];
    size_t len = 0;
    ssize_t r;
    while ((r = read(fds[0], out + len, sizeof out - 1 - len)) > 0)
      len += (size_t)r;
    out[len] = '\0';
    close(fds[0]);
    int st = 0;
    ASSERT(waitpid(pid, &st, 0) == pid);
    ASSERT_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "misuse %zu: the child did not abort (status %#x): %s", i,
               st, out);
    for (int k = 0; k < 3 && misuses[i].want[k]; k++)
      ASSERT_MSG(strstr(out, misuses[i].want[k]), "misuse %zu: no \"%s\" in: %s", i, misuses[i].want[k], out);
  }
  return 0;
}

#else

NO_EMU(emu_bar_pipeline)
NO_EMU(emu_bar_deadlock)

#endif
