/*
 * The grid runner of the CUDA emulation. A block is an OS thread, so that
 * `static thread_local` (what cuda_emu.h makes of __shared__) is the
 * block's shared memory; its CUDA threads are ucontext fibers, switched
 * only at __syncthreads and at their end, in an order shuffled for every
 * barrier phase from a seed (LOOM_EMU_SEED replays one), so that a missing
 * barrier shows as wrong data rather than luck. Blocks beyond the resident
 * count start only when an earlier one ends, as a GPU schedules them:
 * a launch that needs more blocks at once than fit deadlocks here as it
 * would there.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "exec/cuda/emu/cuda_emu.h"
#include "exec/cuda/emu/emu.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <atomic>
#include <mutex>
#include <vector>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#endif
#if EMU_TSAN
/* ThreadSanitizer follows fibers only when told of each switch
 * (sanitizer/tsan_interface.h, declared here so that no header is
 * needed). Every switch is made with no_sync, so TSan sees the CUDA
 * threads of a block as unordered, as they are on a GPU; the grid runner
 * says itself where the program orders them (tsan_release/acquire on the
 * block's start, barriers and end). */
extern "C" void *__tsan_get_current_fiber(void);
extern "C" void *__tsan_create_fiber(unsigned flags);
extern "C" void __tsan_switch_to_fiber(void *fiber, unsigned flags);
extern "C" void __tsan_set_fiber_name(void *fiber, const char *name);
extern "C" void __tsan_acquire(void *addr);
extern "C" void __tsan_release(void *addr);
#endif

thread_local struct emu_thread *emu_self;

namespace {

#if EMU_TSAN
const unsigned kNoSync = 1; /* __tsan_switch_to_fiber_no_sync */
/* TSan reports a race on the stack where it finds it, symbolizer
 * included: a fiber needs more room than the kernel's own frames. */
const size_t kStack = 1 << 20;
#else
/* The kernel's frames are small (its big state is __shared__). */
const size_t kStack = 128 << 10;
#endif

void tsan_release(void *sync) {
#if EMU_TSAN
  __tsan_release(sync);
#endif
}

void tsan_acquire(void *sync) {
#if EMU_TSAN
  __tsan_acquire(sync);
#endif
}

/* A CUDA thread's stack and TSan fiber, kept for the next block once its
 * thread has ended: a launch runs blocks x threads of them, and making
 * and unmaking each (TSan's fiber state above all) cost more than the
 * kernel's work. A TSan fiber used again has its old uses before the new
 * one in program order, which is so: the pool hands it over only once
 * its thread has ended. */
struct fiber_mem {
  void *stack;
  void *tsan;
};

std::mutex g_pool_mu;
/* Under g_pool_mu; never destroyed, since a stream's thread may still run
 * a kernel while the process exits. */
std::vector<fiber_mem> *g_pool = new std::vector<fiber_mem>;

fiber_mem pool_get() {
  {
    std::lock_guard<std::mutex> l(g_pool_mu);
    if (!g_pool->empty()) {
      fiber_mem m = g_pool->back();
      g_pool->pop_back();
      return m;
    }
  }
  fiber_mem m = {nullptr, nullptr};
  m.stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m.stack == MAP_FAILED) {
    fprintf(stderr, "loom emu: cannot map a fiber stack\n");
    abort();
  }
#if EMU_TSAN
  m.tsan = __tsan_create_fiber(0);
#endif
  return m;
}

void pool_put(const fiber_mem &m) {
  std::lock_guard<std::mutex> l(g_pool_mu);
  g_pool->push_back(m);
}

struct block;

struct fiber {
  emu_thread t; /* first: emu_self points at it */
  block *b = nullptr;
  ucontext_t ctx;
  fiber_mem mem = {nullptr, nullptr};
  unsigned bars = 0;      /* the __syncthreads it has passed; its own */
  unsigned char done = 0; /* written by the fiber, read by the scheduler (atomic) */
};
static_assert(offsetof(fiber, t) == 0, "emu_self is a fiber's address");

struct grid {
  unsigned blocks, threads;
  emu_kernel_fn kernel;
  const void *arg;
  uint64_t seed;
  std::atomic<unsigned> next{0};
};

/* One per block run, on the heap: its address is also what TSan's sync
 * objects for the block are keyed on (start, bar, end), which free()
 * forgets with it. */
struct block {
  grid *g;
  unsigned id;
  ucontext_t sched;
  void *sched_tsan = nullptr;
  std::vector<fiber> fibers;
  /* What the block's OS thread did before it starts its threads happens
   * before all they do, as what precedes a launch in its stream does. */
  uint64_t start;
  /* __syncthreads number n is released into bar[n % 2] by every thread
   * arriving and acquired from it by every thread leaving: a thread that
   * reaches barrier n + 1 before a slower one has left barrier n uses the
   * other one, so no thread acquires what a thread of its own phase did. */
  uint64_t bar[2];
  uint64_t end; /* every thread's end, before what the block's OS thread does next */
};

/* The running CUDA thread's emu_self: every thread of a block stores it
 * when it resumes, so the stores are atomic (relaxed; the fibers of one
 * OS thread never run at once), as are the kernel's loads (cuda_emu.h). */
void set_self(emu_thread *t) { __atomic_store_n(&emu_self, t, __ATOMIC_RELAXED); }

uint64_t next_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* From a CUDA thread to its block's scheduler, and back when the
 * scheduler next runs it. `sync` (a barrier's or the block's end) gets
 * the thread's release as its last access before the switch: nothing
 * after it but swapcontext (which TSan does not see) touches memory. */
void to_sched(fiber *f, void *sync) {
  block *b = f->b;
#if EMU_TSAN
  void *sched_tsan = b->sched_tsan;
#endif
  tsan_release(sync);
#if EMU_TSAN
  __tsan_switch_to_fiber(sched_tsan, kNoSync);
#endif
  swapcontext(&f->ctx, &b->sched);
  set_self(&f->t);
}

/* A CUDA thread: its fiber and block come as makecontext's int
 * arguments, since it reads nothing of the block before it has acquired
 * the block's start. */
void fiber_main(unsigned f_lo, unsigned f_hi, unsigned b_lo, unsigned b_hi) {
  block *b = (block *)(((uintptr_t)b_hi << 32) | b_lo);
  tsan_acquire(&b->start);
  fiber *f = (fiber *)(((uintptr_t)f_hi << 32) | f_lo);
  set_self(&f->t);
  b->g->kernel(b->g->arg);
  __atomic_store_n(&f->done, 1, __ATOMIC_RELAXED);
  to_sched(f, &b->end);
}

void run_block(block *b) {
  grid *g = b->g;
#if EMU_TSAN
  b->sched_tsan = __tsan_get_current_fiber();
#endif
  b->fibers.resize(g->threads);
  for (unsigned i = 0; i < g->threads; i++) {
    fiber &f = b->fibers[i];
    f.t = {{i, 0, 0}, {b->id, 0, 0}, {g->threads, 1, 1}, {g->blocks, 1, 1}};
    f.b = b;
    f.mem = pool_get();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.mem.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = nullptr;
    uintptr_t fp = (uintptr_t)&f, bp = (uintptr_t)b;
    makecontext(&f.ctx, (void (*)(void))fiber_main, 4, (unsigned)fp, (unsigned)(fp >> 32), (unsigned)bp,
                (unsigned)(bp >> 32));
#if EMU_TSAN
    char name[48];
    snprintf(name, sizeof name, "emu block %u thread %u", b->id, i);
    __tsan_set_fiber_name(f.mem.tsan, name);
#endif
  }
  tsan_release(&b->start);
  uint64_t seed = g->seed + (uint64_t)b->id * 0x632be59bd9b4e019ull + 1;
  std::vector<unsigned> order(g->threads);
  for (unsigned i = 0; i < g->threads; i++)
    order[i] = i;
  for (;;) {
    /* One phase: every live thread runs to the next barrier or its end. */
    for (unsigned i = g->threads; i > 1; i--) {
      unsigned j = (unsigned)(next_rand(&seed) % i);
      unsigned x = order[i - 1];
      order[i - 1] = order[j];
      order[j] = x;
    }
    unsigned live = 0;
    for (unsigned k : order) {
      fiber &f = b->fibers[k];
      if (__atomic_load_n(&f.done, __ATOMIC_RELAXED))
        continue;
#if EMU_TSAN
      void *ft = f.mem.tsan;
      __tsan_switch_to_fiber(ft, kNoSync);
#endif
      swapcontext(&b->sched, &f.ctx);
      if (!__atomic_load_n(&f.done, __ATOMIC_RELAXED))
        live++;
    }
    if (live == 0)
      break;
    if (live != g->threads) {
      /* A thread that ended while others wait at a barrier: on a GPU that
       * is undefined (it hangs or corrupts); here it is a loud stop. */
      fprintf(stderr, "loom emu: block %u: %u of %u threads ended while the others wait at __syncthreads\n", b->id,
              g->threads - live, g->threads);
      abort();
    }
  }
  /* Every thread has ended: all they did happens before what this OS
   * thread does next (the next block, its exit, which the grid's join and
   * so the stream's next work follow). */
  tsan_acquire(&b->end);
  for (fiber &f : b->fibers)
    pool_put(f.mem);
  set_self(nullptr);
}

void *worker_main(void *p) {
  grid *g = (grid *)p;
  for (;;) {
    unsigned id = g->next.fetch_add(1);
    if (id >= g->blocks)
      break;
    block *b = new block;
    b->g = g;
    b->id = id;
    run_block(b);
    delete b;
  }
  return nullptr;
}

} // namespace

/* A barrier: the calling thread's work so far happens before every
 * thread's work after it (block::bar), then the next thread runs. */
void emu_syncthreads(void) {
  fiber *f = (fiber *)__atomic_load_n(&emu_self, __ATOMIC_RELAXED);
  void *sync = &f->b->bar[f->bars % 2];
  to_sched(f, sync);
  tsan_acquire(sync);
  f->bars++;
}

void emu_run_grid(unsigned blocks, unsigned threads, unsigned resident, emu_kernel_fn kernel, const void *arg,
                  uint64_t seed) {
  grid g;
  g.blocks = blocks;
  g.threads = threads ? threads : 1;
  g.kernel = kernel;
  g.arg = arg;
  g.seed = seed;
  unsigned nworkers = blocks < resident ? blocks : resident;
  if (nworkers == 0)
    nworkers = 1;
  std::vector<pthread_t> th(nworkers);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  for (unsigned i = 0; i < nworkers; i++)
    if (pthread_create(&th[i], &attr, worker_main, &g) != 0) {
      fprintf(stderr, "loom emu: cannot start a block's thread\n");
      abort();
    }
  pthread_attr_destroy(&attr);
  for (unsigned i = 0; i < nworkers; i++)
    pthread_join(th[i], nullptr);
}
