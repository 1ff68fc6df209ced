/*
 * The grid runner of the CUDA emulation. A block is an OS thread, so that
 * `static thread_local` (what cuda_emu.h makes of __shared__) is the
 * block's shared memory; its CUDA threads are ucontext fibers, switched
 * only at barriers (__syncthreads, the named barriers of emu_bar_sync and
 * emu_bar_arrive), emu_yield and their end. The block's scheduler runs
 * them in rounds: each round takes the threads in an order shuffled from
 * a seed (LOOM_EMU_SEED replays one) and runs each that can run until it
 * waits, yields or ends, so that a missing barrier shows as wrong data
 * rather than luck. A thread waiting at a barrier runs again once the
 * barrier completes; one that yields, in the next round. Blocks beyond the resident
 * count start only when an earlier one ends, as a GPU schedules them:
 * a launch that needs more blocks at once than fit deadlocks here as it
 * would there.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "exec/cuda/emu/cuda_emu.h"
#include "exec/cuda/emu/emu.h"

#include <pthread.h>
#include <sched.h>
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

/* What a CUDA thread asks of its block's scheduler when it switches to it. */
enum req_kind : unsigned char { REQ_SYNC = 1, REQ_ARRIVE, REQ_YIELD, REQ_END };
/* Where the scheduler holds a thread: it can run, it waits at a barrier,
 * it has ended. */
enum fiber_state : unsigned char { F_RUN, F_BAR, F_DONE };

struct fiber {
  emu_thread t; /* first: emu_self points at it */
  block *b = nullptr;
  ucontext_t ctx;
  fiber_mem mem = {nullptr, nullptr};
  /* The request: written by the thread before it switches, read by the
   * scheduler after (atomic, relaxed: TSan sees the two as unordered). */
  unsigned char req = 0;
  unsigned req_id = 0, req_count = 0;
  fiber_state state = F_RUN; /* the scheduler's own */
};
static_assert(offsetof(fiber, t) == 0, "emu_self is a fiber's address");

/* PTX has 16 barriers per block; 0 is __syncthreads'. */
const unsigned kBars = 16;

struct barrier {
  /* Completions so far: written by the scheduler, read by a thread about
   * to arrive (atomic, relaxed), which is the generation its arrival
   * joins, since no other thread of the block runs in between. */
  unsigned gen = 0;
  unsigned arrived = 0, count = 0; /* this generation's; the scheduler's own */
  std::vector<unsigned> waiters;   /* the scheduler's own */
  /* Generation g's arrivals are released into sync[g % 4] and its
   * waiters acquire from it: a thread may arrive at the next generations
   * before a slower one has left this one, and then uses other objects.
   * (An acquire can only see more than its own generation's releases,
   * never less: at worst a race in the kernel goes unreported.) */
  uint64_t sync[4];
};

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
  barrier bars[kBars];
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

/* From a CUDA thread to its block's scheduler with a request, and back
 * when the scheduler next runs it. `sync` (a barrier's or the block's
 * end; none for a yield) gets the thread's release as its last access
 * before the switch: nothing after it but swapcontext (which TSan does
 * not see) touches memory. */
void to_sched(fiber *f, req_kind req, unsigned id, unsigned count, void *sync) {
  block *b = f->b;
#if EMU_TSAN
  void *sched_tsan = b->sched_tsan;
#endif
  __atomic_store_n(&f->req_id, id, __ATOMIC_RELAXED);
  __atomic_store_n(&f->req_count, count, __ATOMIC_RELAXED);
  __atomic_store_n(&f->req, (unsigned char)req, __ATOMIC_RELAXED);
  if (sync)
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
  to_sched(f, REQ_END, 0, 0, &b->end);
}

[[noreturn]] void misuse(const char *line) {
  fprintf(stderr, "%s\n", line);
  fflush(stderr);
  abort();
}

/* Thread k's arrival at the barrier it asked for; `wait`: bar.sync. */
void arrive(block *b, unsigned k, bool wait) {
  fiber &f = b->fibers[k];
  unsigned id = __atomic_load_n(&f.req_id, __ATOMIC_RELAXED);
  unsigned count = __atomic_load_n(&f.req_count, __ATOMIC_RELAXED);
  barrier &bar = b->bars[id];
  char line[200];
  if (count == 0 || count > b->g->threads) {
    snprintf(line, sizeof line,
             "loom emu: block %u thread %u: barrier %u with a count of %u, but the block has %u threads", b->id, k, id,
             count, b->g->threads);
    misuse(line);
  }
  if (bar.arrived == 0) {
    bar.count = count;
  } else if (bar.count != count) {
    snprintf(line, sizeof line,
             "loom emu: block %u thread %u: barrier %u with a count of %u, but the threads before it said %u", b->id,
             k, id, count, bar.count);
    misuse(line);
  }
  bar.arrived++;
  if (wait) {
    bar.waiters.push_back(k);
    f.state = F_BAR;
  }
  if (bar.arrived == bar.count) {
    for (unsigned w : bar.waiters)
      b->fibers[w].state = F_RUN;
    bar.waiters.clear();
    bar.arrived = 0;
    __atomic_store_n(&bar.gen, bar.gen + 1, __ATOMIC_RELAXED);
  }
}

/* No thread can run: each that has not ended waits at a barrier that
 * only a thread of the block could complete. On a GPU the block hangs;
 * here it is a loud stop that says where. */
[[noreturn]] void deadlock(block *b, unsigned live) {
  unsigned ended = b->g->threads - live;
  unsigned waited = 0, only = 0;
  for (unsigned id = 0; id < kBars; id++)
    if (!b->bars[id].waiters.empty()) {
      waited++;
      only = id;
    }
  char line[1024];
  int n;
  if (waited == 1 && only == 0 && ended > 0 && b->bars[0].count == b->g->threads)
    n = snprintf(line, sizeof line, "loom emu: block %u: %u of %u threads ended while the others wait at __syncthreads",
                 b->id, ended, b->g->threads);
  else
    n = snprintf(line, sizeof line,
                 "loom emu: block %u: deadlock: each of its %u running threads waits at a barrier no thread can "
                 "complete (%u of %u threads ended)",
                 b->id, live, ended, b->g->threads);
  for (unsigned id = 0; id < kBars && n > 0 && (size_t)n < sizeof line; id++) {
    const barrier &bar = b->bars[id];
    if (bar.waiters.empty())
      continue;
    n += snprintf(line + n, sizeof line - (size_t)n, "; barrier %u: %u of %u arrived, waiting: thread", id,
                  bar.arrived, bar.count);
    for (size_t i = 0; i < bar.waiters.size() && i < 8 && n > 0 && (size_t)n < sizeof line; i++)
      n += snprintf(line + n, sizeof line - (size_t)n, " %u", bar.waiters[i]);
    if (bar.waiters.size() > 8 && n > 0 && (size_t)n < sizeof line)
      n += snprintf(line + n, sizeof line - (size_t)n, " and %zu more", bar.waiters.size() - 8);
  }
  misuse(line);
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
  unsigned live = g->threads;
  while (live > 0) {
    /* One round: every thread that can run runs until it waits at a
     * barrier, yields or ends (an arrival without a wait goes on at once). */
    for (unsigned i = g->threads; i > 1; i--) {
      unsigned j = (unsigned)(next_rand(&seed) % i);
      unsigned x = order[i - 1];
      order[i - 1] = order[j];
      order[j] = x;
    }
    unsigned ran = 0;
    bool moved = false; /* some thread did more than yield */
    for (unsigned k : order) {
      fiber &f = b->fibers[k];
      if (f.state != F_RUN)
        continue;
      ran++;
      for (;;) {
#if EMU_TSAN
        void *ft = f.mem.tsan;
        __tsan_switch_to_fiber(ft, kNoSync);
#endif
        swapcontext(&b->sched, &f.ctx);
        unsigned char req = __atomic_load_n(&f.req, __ATOMIC_RELAXED);
        if (req == REQ_ARRIVE) {
          arrive(b, k, false);
          moved = true;
          continue;
        }
        if (req == REQ_SYNC) {
          arrive(b, k, true);
          moved = true;
        } else if (req == REQ_END) {
          f.state = F_DONE;
          live--;
          moved = true;
        }
        break;
      }
    }
    if (live > 0 && ran == 0)
      deadlock(b, live);
    /* Every thread only yielded: what they wait for is outside the block
     * (another block, a stream, the host), so let the OS thread give way. */
    if (!moved)
      sched_yield();
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

namespace {

fiber *self_fiber(const char *what) {
  fiber *f = (fiber *)__atomic_load_n(&emu_self, __ATOMIC_RELAXED);
  if (!f) {
    char line[120];
    snprintf(line, sizeof line, "loom emu: %s outside a kernel", what);
    misuse(line);
  }
  return f;
}

/* An arrival at barrier `id`: the thread's work so far is released into
 * the generation it joins; the sync object, so that a waiter acquires it. */
void *arrival_sync(fiber *f, unsigned id, const char *what) {
  if (id >= kBars) {
    char line[160];
    snprintf(line, sizeof line, "loom emu: block %u thread %u: %s(%u, ...): barriers are 0 to %u", f->t.bid.x,
             f->t.tid.x, what, id, kBars - 1);
    misuse(line);
  }
  barrier &bar = f->b->bars[id];
  return &bar.sync[__atomic_load_n(&bar.gen, __ATOMIC_RELAXED) % 4];
}

} // namespace

/* A barrier: the work of every thread arriving happens before every
 * waiting thread's work after it (barrier::sync), then another thread runs. */
void emu_bar_sync(unsigned id, unsigned count) {
  fiber *f = self_fiber("emu_bar_sync");
  void *sync = arrival_sync(f, id, "emu_bar_sync");
  to_sched(f, REQ_SYNC, id, count, sync);
  tsan_acquire(sync);
}

/* Counted at once; the scheduler resumes the same thread, so no other
 * thread runs in between (an arrival is no switch point of its own). */
void emu_bar_arrive(unsigned id, unsigned count) {
  fiber *f = self_fiber("emu_bar_arrive");
  to_sched(f, REQ_ARRIVE, id, count, arrival_sync(f, id, "emu_bar_arrive"));
}

void emu_yield(void) { to_sched(self_fiber("emu_yield"), REQ_YIELD, 0, 0, nullptr); }

void emu_syncthreads(void) {
  fiber *f = self_fiber("__syncthreads");
  emu_bar_sync(0, f->b->g->threads);
}

const struct emu_thread *emu_current(void) { return __atomic_load_n(&emu_self, __ATOMIC_RELAXED); }

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
