/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "comm/comm.h"
#include "exec/copy.h"
#include "exec/flat.h"
#include "exec/host_exec.h"
#include "exec/reduce.h"
#include "exec/slot.h"
#include "transport/shm_arena.h"

#include <stdio.h>
#include <string.h>

enum flat_state {
  FLAT_WRITE = 0,
  FLAT_REDUCE = 1,
  FLAT_GATHER = 2,
  FLAT_DONE = 3,
  /* By CPU: add this rank's data to its CPU's sum after the rank before
   * it there, then the barrier; add up the sums (the CPU's leader) or
   * copy the CPU's result once the leader has written it. */
  FLAT_CPU_ADD = 4,
  FLAT_CPU_SUM = 5,
  FLAT_CPU_COPY = 6,
};

/* A slice's reduction goes through the ranks' regions this much at a
 * time, so that the partial result stays in the core's cache. */
#define FLAT_BLOCK (16u << 10)

/* From COPY_STREAM_MIN on (exec_streams), an output that is not also the
 * input is written with streaming stores: the call has not read its
 * lines, so they are seldom in this core's cache, and reading each before
 * writing it is a third of the memory traffic of the copy, wasted.
 * Measured faster from 1 MiB on 4 and 8 ranks, the same at 256 KiB and on
 * 2 (perf/README.md). Copying the inputs into the regions so is slower:
 * the other ranks read them next, and would read them from memory. */

static void copy_out(int stream, void *to, const void *from, size_t bytes) {
  if (stream)
    copy_streaming(to, from, bytes);
  else
    memcpy(to, from, bytes);
}

/* Rank r's slice of a round of `len` elements: [*lo, *hi), cut at
 * multiples of 64 bytes so that no two ranks write one cache line. */
static void slice_of(const struct work *w, uint64_t len, int r, uint64_t *lo, uint64_t *hi) {
  uint64_t n = (uint64_t)w->comm->nranks, align = LOOM_MAX((uint64_t)1, 64 / w->esize);
  uint64_t per = (len + n - 1) / n;
  per = (per + align - 1) / align * align;
  *lo = LOOM_MIN(len, per * (uint64_t)r);
  *hi = LOOM_MIN(len, *lo + per);
}

static void round_range(const struct work *w, uint64_t *off, uint64_t *len) {
  *off = w->flat.round * w->flat.per_round;
  *len = LOOM_MIN(w->flat.per_round, w->task->count - *off);
}

/* The reduction as a flat call applies it: `in` to this rank's input as
 * it enters (PreMulSum's scalar, the one thing about a reduction that
 * differs between ranks), `partial` to combine the inputs. Each element
 * is summed in one place, so Avg on float and double sums the inputs as
 * they are and divides once at the end, rather than scaling each by
 * 1/nranks first: the mean of integers comes out exact, as a sum does.
 * The narrow types keep the scaling, whose sum cannot overflow them. */
static void flat_ops(const struct work *w, struct red_op *in, struct red_op *partial) {
  *in = w->task->red;
  int dt = w->task->dtype;
  if (w->task->op == ncclAvg && in->premul && (dt == ncclFloat32 || dt == ncclFloat64)) {
    in->premul = 0;
    in->postdiv = 1;
    in->divisor = w->comm->nranks;
  }
  *partial = *in;
  partial->premul = 0;
}

static void write_input(const struct work *w, const struct red_op *op, char *to, const char *from, uint64_t n) {
  if (n == 0)
    return;
  if (op->premul)
    red_copy(op, to, NULL, from, n, 0);
  else
    memcpy(to, from, n * w->esize);
}

/* Ranks whose calls match but that go about it differently: by CPU and
 * by slices. Every rank decides from the same pinning and the same
 * windows, so only a rank that failed to register a window the others
 * have (out of memory) makes them differ. */
static ncclResult_t mode_mismatch(const struct work *w, int r, int theirs_by_cpu) {
  return err_set(ncclInvalidUsage,
                 "rank %d runs flat AllReduce #%llu %s and rank %d %s: the ranks chose differently for one call. "
                 "Communicators with windows that every rank maps go by slices, so every rank must have "
                 "registered the same windows",
                 w->comm->rank, (unsigned long long)w->seq, w->flat.by_cpu ? "by CPU" : "by slices", r,
                 theirs_by_cpu ? "by CPU" : "by slices");
}

static ncclResult_t check_call(const struct work *w, const struct shm_arena *a, int r) {
  struct slot_hdr want;
  slot_expect(w->task, w->seq, &want);
  const struct arena_rank *x = &a->ranks[r];
  const struct slot_hdr *got = w->flat.whole ? &x->slot[w->flat.use & 1].hdr : &x->call[w->flat.use & 1].hdr;
  if (!slot_matches(&want, got, 1))
    return slot_mismatch(&want, got, a->me, r, 1);
  if (!w->flat.whole && (got->where == SLOT_BY_CPU) != w->flat.by_cpu)
    return mode_mismatch(w, r, got->where == SLOT_BY_CPU);
  return ncclSuccess;
}

static ncclResult_t check_calls(const struct work *w, const struct shm_arena *a) {
  for (int r = 0; r < a->nranks; r++)
    if (r != a->me)
      CHECK(check_call(w, a, r));
  return ncclSuccess;
}

/* Round 0: this rank's buffers, placed in windows where they lie in one
 * that every rank maps, in its call header. Its input goes there only
 * as it is: a PreMulSum scalar (this rank's own) is applied by a copy. */
static void place_buffers(struct work *w, struct arena_call *c, const struct red_op *in) {
  size_t bytes = w->task->count * w->esize;
  const struct comm_win *s = in->premul ? NULL : comm_win_holding(w->comm, w->src, bytes);
  const struct comm_win *d = comm_win_holding(w->comm, w->dst, bytes);
  /* The header has 32 bits for an id: a later window goes by copies. */
  if (s && s->id > UINT32_MAX)
    s = NULL;
  if (d && d->id > UINT32_MAX)
    d = NULL;
  w->flat.src_direct = s != NULL;
  w->flat.dst_direct = d != NULL;
  c->src_win = s ? (uint32_t)s->id : 0;
  c->src_off = s ? (uint64_t)(w->src - s->buff) : 0;
  c->dst_win = d ? (uint32_t)d->id : 0;
  c->dst_off = d ? (uint64_t)(w->dst - d->buff) : 0;
}

/* Rank r's buffer that its call header places in window `id` at `off`,
 * as this process sees it; NULL for id 0. */
static ncclResult_t peer_buffer(const struct work *w, int r, uint32_t id, uint64_t off, const char *what, char **out) {
  *out = NULL;
  if (id == 0)
    return ncclSuccess;
  size_t bytes = w->task->count * w->esize;
  const struct ncclComm *comm = w->comm;
  for (const struct comm_win *v = comm->direct_wins; v; v = v->next) {
    if (v->id != id)
      continue;
    if (off > v->peer_size[r] || bytes > v->peer_size[r] - off)
      return err_set(ncclInvalidUsage,
                     "rank %d's %s of %zu bytes at offset %llu of its window %u runs past the window's %zu bytes",
                     r, what, bytes, (unsigned long long)off, id, v->peer_size[r]);
    *out = v->peer[r] + off;
    return ncclSuccess;
  }
  return err_set(ncclInvalidUsage,
                 "rank %d's %s lies in window %u (registration number %u on this communicator), which rank %d "
                 "does not have: every rank registers and deregisters windows in the same order",
                 r, what, id, id, comm->rank);
}

/* After round 0's first barrier: where every other rank's buffers are,
 * and whether another rank reads results from the regions. */
static ncclResult_t find_buffers(struct work *w, struct shm_arena *a) {
  int reads = 0, writes = 0;
  w->flat.regions_out = 0;
  for (int r = 0; r < a->nranks; r++) {
    a->peer_src[r] = NULL;
    a->peer_dst[r] = NULL;
    if (r == a->me)
      continue;
    const struct arena_call *c = &a->ranks[r].call[w->flat.use0 & 1];
    char *src;
    CHECK(peer_buffer(w, r, c->src_win, c->src_off, "send buffer", &src));
    CHECK(peer_buffer(w, r, c->dst_win, c->dst_off, "receive buffer", &a->peer_dst[r]));
    a->peer_src[r] = src;
    w->flat.regions_out |= a->peer_dst[r] == NULL;
    reads += src != NULL;
    writes += a->peer_dst[r] != NULL;
  }
  if ((reads || writes) && !a->said_direct) {
    a->said_direct = 1;
    INFO(LOG_SHM, "rank %d: flat AllReduce #%llu reads %d and writes %d of the other %d ranks' buffers in place, "
         "in windows", a->me, (unsigned long long)w->seq, reads, writes, a->nranks - 1);
  }
  return ncclSuccess;
}

/* Round 0: this rank's call header, with where its buffers lie (by CPU
 * there are no windows, so none) and which way it goes. */
static void post_call(struct work *w, struct shm_arena *a, const struct red_op *in) {
  w->flat.use0 = w->flat.use;
  struct arena_call *c = &a->ranks[a->me].call[w->flat.use & 1];
  arena_hdr_begin(&c->flag);
  slot_mine(w->task, w->seq, a->me, &c->hdr);
  c->hdr.bytes = 0;
  c->hdr.where = w->flat.by_cpu ? SLOT_BY_CPU : SLOT_INLINE;
  place_buffers(w, c, in);
  arena_hdr_end(&c->flag, w->flat.use);
}

static void write_round(struct work *w, struct shm_arena *a, const struct red_op *in) {
  uint64_t off, len, lo, hi;
  round_range(w, &off, &len);
  w->flat.use = a->use++;
  char *mine = arena_region(a, w->flat.use, a->me);
  const char *src = w->src + off * w->esize;
  if (w->flat.whole) {
    struct arena_slot *slot = &a->ranks[a->me].slot[w->flat.use & 1];
    arena_hdr_begin(&slot->flag);
    write_input(w, in, slot->data, src, len);
    slot_mine(w->task, w->seq, a->me, &slot->hdr);
    slot->hdr.bytes = 0;
    arena_post(a, w->flat.use);
    return;
  }
  if (w->flat.round == 0)
    post_call(w, a, in);
  /* This rank's own slice it reads from its input; the others read the
   * rest in place where it lies in a window. */
  slice_of(w, len, a->me, &lo, &hi);
  if (!w->flat.src_direct) {
    write_input(w, in, mine, src, lo);
    write_input(w, in, mine + hi * w->esize, src + hi * w->esize, len - hi);
  }
  w->flat.bar = arena_arrive(a);
}

/* Every rank's data reduced in rank order into the output: each rank
 * computes the same values. */
static void reduce_whole(struct work *w, const struct shm_arena *a, const struct red_op *partial) {
  uint64_t off, len;
  round_range(w, &off, &len);
  char *dst = w->dst + off * w->esize;
  int p = (int)(w->flat.use & 1);
  memcpy(dst, a->ranks[0].slot[p].data, len * w->esize);
  for (int r = 1; r < a->nranks; r++)
    red_reduce(partial, dst, NULL, dst, a->ranks[r].slot[p].data, len, r == a->nranks - 1);
}

/* This rank's slice: its own input first (from its buffer: in place, the
 * output is the input), then the others' in rank order, from their
 * buffers where they lie in windows, else from their regions; the last
 * step writes the result into the output and, where a rank gathers from
 * the regions, this rank's region at once. Then into the outputs of the
 * ranks whose outputs lie in windows, from the block just written, still
 * in this core's cache. Only this rank touches this slice of any
 * buffer, so a rank in place is read here before it is written. */
static void reduce_slice(struct work *w, const struct shm_arena *a, const struct red_op *in,
                         const struct red_op *partial) {
  uint64_t off, len, lo, hi;
  round_range(w, &off, &len);
  slice_of(w, len, a->me, &lo, &hi);
  int last = a->me == a->nranks - 1 ? a->nranks - 2 : a->nranks - 1;
  uint64_t block = LOOM_MAX((uint64_t)1, FLAT_BLOCK / w->esize);
  size_t es = w->esize;
  int stream = exec_streams(w);
  for (uint64_t b = lo; b < hi; b += block) {
    uint64_t n = LOOM_MIN(block, hi - b);
    char *dst = w->dst + (off + b) * es;
    red_copy(in, dst, NULL, w->src + (off + b) * es, n, 0);
    for (int r = 0; r < a->nranks; r++) {
      if (r == a->me)
        continue;
      char *res = r == last && w->flat.regions_out ? arena_region(a, w->flat.use, a->me) + b * es : NULL;
      const char *from = a->peer_src[r] ? a->peer_src[r] + (off + b) * es : arena_region(a, w->flat.use, r) + b * es;
      red_reduce(partial, dst, res, dst, from, n, r == last);
    }
    /* Starting past this rank spreads the ranks' writes over the outputs.
     * A rank in place has its output's lines just read here: they are in
     * this core's cache, where ordinary stores are the faster. */
    for (int k = 1; k < a->nranks; k++) {
      int r = (a->me + k) % a->nranks;
      if (a->peer_dst[r])
        copy_out(stream && a->peer_dst[r] != a->peer_src[r], a->peer_dst[r] + (off + b) * es, dst, n * es);
    }
  }
}

static void gather_slices(struct work *w, const struct shm_arena *a) {
  if (w->flat.dst_direct)
    return; /* the other ranks wrote their slices into the output */
  uint64_t off, len, lo, hi;
  round_range(w, &off, &len);
  /* In place, this round's output lines were read as it began (its input
   * copied in): ordinary stores find them in the cache. */
  int stream = exec_streams_out(w);
  for (int r = 0; r < a->nranks; r++) {
    slice_of(w, len, r, &lo, &hi);
    if (r != a->me && hi > lo)
      copy_out(stream, w->dst + (off + lo) * w->esize, arena_region(a, w->flat.use, r) + lo * w->esize,
               (hi - lo) * w->esize);
  }
}

/* By CPU. Where ranks are pinned several to a CPU, the ranks of one CPU
 * run one after another and share its cache: each adds its data straight
 * into the CPU's sum, still in that cache from the rank before it, and
 * one barrier later the CPU's leader adds the CPUs' sums into the CPU's
 * result, which its other ranks copy from the same cache. The copy of
 * every rank's input into a region of its own, read by another rank on
 * either CPU, is gone. The ranks of a CPU add in rank order, so the
 * result is the same on every rank and every run. */
static void cpu_begin(struct work *w, struct shm_arena *a, const struct red_op *in) {
  w->flat.use = a->use++;
  w->flat.cpu_round = a->cpu_rounds++;
  if (w->flat.round == 0)
    post_call(w, a, in);
}

/* The sum's count once every rank before this one on its CPU has added
 * this round's data. */
static uint64_t cpu_turn(const struct work *w, const struct shm_arena *a) {
  return w->flat.cpu_round * (uint64_t)a->cpu_ranks + (uint64_t)a->cpu_pos;
}

static int cpu_my_turn(const struct work *w, const struct shm_arena *a) {
  return atomic_load_explicit(&a->head->cpu[a->cpu].added, memory_order_acquire) >= cpu_turn(w, a);
}

static int cpu_result_ready(const struct work *w, const struct shm_arena *a) {
  return atomic_load_explicit(&a->head->cpu[a->cpu].ready, memory_order_acquire) > w->flat.cpu_round;
}

static ncclResult_t cpu_add(struct work *w, struct shm_arena *a, const struct red_op *in) {
  uint64_t off, len;
  round_range(w, &off, &len);
  /* The rank before this one wrote the sum: its call must be this one. */
  if (w->flat.round == 0 && a->cpu_prev >= 0)
    CHECK(check_call(w, a, a->cpu_prev));
  char *sum = arena_cpu_sum(a, w->flat.use, a->cpu);
  const char *src = w->src + off * w->esize;
  if (a->cpu_pos == 0)
    write_input(w, in, sum, src, len);
  else
    red_reduce(in, sum, NULL, sum, src, len, 0);
  struct arena_cpu *c = &a->head->cpu[a->cpu];
  arena_cpu_move(&c->added, &c->added_sleepers);
  w->flat.bar = arena_arrive(a);
  return ncclSuccess;
}

/* The leader: the CPUs' sums, in CPU order (the same on every CPU), into
 * this CPU's result and this rank's output, a block at a time while the
 * block is in the cache. */
static void cpu_sum(struct work *w, const struct shm_arena *a, const struct red_op *partial) {
  uint64_t off, len;
  round_range(w, &off, &len);
  size_t es = w->esize;
  uint64_t block = LOOM_MAX((uint64_t)1, FLAT_BLOCK / es);
  char *res = arena_cpu_result(a, w->flat.use, a->cpu);
  int stream = exec_streams_out(w);
  for (uint64_t b = 0; b < len; b += block) {
    uint64_t n = LOOM_MIN(block, len - b);
    char *r = res + b * es;
    if (a->ncpus == 1)
      red_copy(partial, r, NULL, arena_cpu_sum(a, w->flat.use, 0) + b * es, n, 1);
    for (int k = 1; k < a->ncpus; k++)
      red_reduce(partial, r, NULL, k == 1 ? arena_cpu_sum(a, w->flat.use, 0) + b * es : r,
                 arena_cpu_sum(a, w->flat.use, k) + b * es, n, k == a->ncpus - 1);
    copy_out(stream, w->dst + (off + b) * es, r, n * es);
  }
  struct arena_cpu *c = &a->head->cpu[a->cpu];
  arena_cpu_move(&c->ready, &c->ready_sleepers);
}

static void cpu_copy(struct work *w, const struct shm_arena *a) {
  uint64_t off, len;
  round_range(w, &off, &len);
  copy_out(exec_streams_out(w), w->dst + off * w->esize, arena_cpu_result(a, w->flat.use, a->cpu), len * w->esize);
}

/* Whether rank r has not yet done what the work waits for: posted its
 * slot (whole reductions) or reached the barrier. */
static int missing(const struct work *w, const struct shm_arena *a, int r) {
  if (w->flat.whole)
    return r != a->me && !arena_slot_posted(a, r, w->flat.use);
  if (w->flat.state == FLAT_CPU_ADD) {
    /* The first rank of this CPU whose data is not in the sum yet. */
    if (a->cpu_of[r] != a->cpu || r >= a->me)
      return 0;
    uint64_t added = atomic_load_explicit(&a->head->cpu[a->cpu].added, memory_order_acquire);
    uint64_t pos = 0;
    for (int q = 0; q < r; q++)
      pos += a->cpu_of[q] == a->cpu;
    return added < cpu_turn(w, a) && added == w->flat.cpu_round * (uint64_t)a->cpu_ranks + pos;
  }
  if (w->flat.state == FLAT_CPU_COPY)
    return r == a->cpu_leader && !cpu_result_ready(w, a);
  return atomic_load_explicit(&a->ranks[r].arrived, memory_order_acquire) <= w->flat.bar;
}

static int waiting(const struct work *w, const struct shm_arena *a) {
  if (w->flat.state == FLAT_CPU_ADD)
    return !cpu_my_turn(w, a);
  if (w->flat.state == FLAT_CPU_COPY)
    return !cpu_result_ready(w, a);
  if (!w->flat.whole)
    return !arena_passed(a, w->flat.bar);
  for (int r = 0; r < a->nranks; r++)
    if (missing(w, a, r))
      return 1;
  return 0;
}

/* The round done: the next one, or the end of the call. */
static void next_round(struct work *w) { w->flat.state = ++w->flat.round < w->flat.nrounds ? FLAT_WRITE : FLAT_DONE; }

ncclResult_t flat_progress(struct work *w, int *moved, int *done) {
  struct ncclComm *comm = w->comm;
  struct shm_arena *a = comm->arena;
  *done = 0;
  if (!a)
    return err_set(ncclInternalError, "rank %d: a flat collective was planned on a communicator without an arena",
                   comm->rank);
  /* The others' data had PreMulSum applied by their ranks. */
  struct red_op in, partial;
  flat_ops(w, &in, &partial);
  for (;;) {
    switch (w->flat.state) {
    case FLAT_WRITE:
      if (w->flat.by_cpu) {
        cpu_begin(w, a, &in);
        w->flat.state = FLAT_CPU_ADD;
      } else {
        write_round(w, a, &in);
        w->flat.state = FLAT_REDUCE;
      }
      *moved = 1;
      break;
    case FLAT_REDUCE:
      if (waiting(w, a))
        return arena_failed(comm);
      if (w->flat.round == 0) {
        CHECK(check_calls(w, a));
        if (!w->flat.whole)
          CHECK(find_buffers(w, a));
      }
      if (w->flat.whole) {
        reduce_whole(w, a, &partial);
        w->flat.state = FLAT_DONE;
        break;
      }
      reduce_slice(w, a, &in, &partial);
      w->flat.bar = arena_arrive(a);
      w->flat.state = FLAT_GATHER;
      *moved = 1;
      break;
    case FLAT_GATHER:
      if (waiting(w, a))
        return arena_failed(comm);
      gather_slices(w, a);
      next_round(w);
      *moved = 1;
      break;
    case FLAT_CPU_ADD:
      if (waiting(w, a))
        return arena_failed(comm);
      CHECK(cpu_add(w, a, &in));
      w->flat.state = FLAT_CPU_SUM;
      *moved = 1;
      break;
    case FLAT_CPU_SUM:
      if (waiting(w, a))
        return arena_failed(comm);
      if (w->flat.round == 0)
        CHECK(check_calls(w, a));
      *moved = 1;
      if (a->cpu_pos != 0) {
        w->flat.state = FLAT_CPU_COPY;
        break;
      }
      cpu_sum(w, a, &partial);
      next_round(w);
      break;
    case FLAT_CPU_COPY:
      if (waiting(w, a))
        return arena_failed(comm);
      cpu_copy(w, a);
      next_round(w);
      *moved = 1;
      break;
    default:
      *moved = 1;
      *done = 1;
      return ncclSuccess;
    }
  }
}

/* The states that wait for other ranks. */
static int waits(int state) { return state != FLAT_WRITE && state != FLAT_DONE; }

static int blocked(const struct work *w) {
  const struct shm_arena *a = w->comm->arena;
  return a && waits(w->flat.state) && waiting(w, a);
}

int flat_sleep_target(const struct work *w, _Atomic uint64_t **counter, uint64_t *seen, _Atomic uint32_t **sleepers) {
  const struct shm_arena *a = w->comm->arena;
  if (!a || !waits(w->flat.state))
    return 0;
  struct arena_head *h = a->head;
  if (w->flat.state == FLAT_CPU_ADD || w->flat.state == FLAT_CPU_COPY) {
    struct arena_cpu *c = &h->cpu[a->cpu];
    int add = w->flat.state == FLAT_CPU_ADD;
    *counter = add ? &c->added : &c->ready;
    *sleepers = add ? &c->added_sleepers : &c->ready_sleepers;
    /* Read before the test: a move after it changes it. */
    *seen = atomic_load(*counter);
    return waiting(w, a);
  }
  if (w->flat.whole) {
    /* Read before the slots: a post after it moves it. */
    uint64_t posted = atomic_load(&h->posted);
    if (!waiting(w, a))
      return 0;
    *counter = &h->posted;
    *seen = posted;
    *sleepers = &h->posted_sleepers;
    return 1;
  }
  if (!waiting(w, a))
    return 0;
  *counter = &h->gen;
  *seen = w->flat.bar; /* all earlier barriers are passed: gen is exactly this while blocked */
  *sleepers = &h->sleepers;
  return 1;
}

/* The ranks the work waits for, as "3, 5"; the first, or -1. */
static int missing_list(const struct work *w, char *buf, size_t len) {
  const struct shm_arena *a = w->comm->arena;
  int first = -1;
  size_t used = 0;
  if (len)
    buf[0] = '\0';
  for (int r = 0; r < a->nranks; r++) {
    if (!missing(w, a, r))
      continue;
    if (first < 0)
      first = r;
    if (used < len) {
      int k = snprintf(buf + used, len - used, "%s%d", used ? ", " : "", r);
      used += k > 0 ? (size_t)k : 0;
    }
  }
  return first;
}

ncclResult_t flat_check(const struct work *w) {
  if (!blocked(w))
    return ncclSuccess;
  CHECK(arena_failed(w->comm));
  const struct shm_arena *a = w->comm->arena;
  for (int r = 0; r < a->nranks; r++)
    if (missing(w, a, r))
      CHECK(comm_peer_alive(w->comm, r));
  return ncclSuccess;
}

int flat_waiting_rank(const struct work *w) {
  char buf[8];
  return blocked(w) ? missing_list(w, buf, sizeof buf) : -1;
}

void flat_describe_wait(const struct work *w, char *buf, size_t len) {
  if (!blocked(w)) {
    snprintf(buf, len, "nothing (the flat collective is not blocked)");
    return;
  }
  char ranks[160];
  missing_list(w, ranks, sizeof ranks);
  unsigned long long round = w->flat.round + 1, nrounds = w->flat.nrounds;
  if (w->flat.whole)
    snprintf(buf, len, "rank(s) %s to post their data in the shared-memory arena (flat whole reduction)", ranks);
  else if (w->flat.state == FLAT_CPU_ADD)
    snprintf(buf, len, "rank %s, before this rank on its CPU, to add its data to the CPU's sum in round %llu of %llu "
             "(flat reduction by CPU)", ranks, round, nrounds);
  else if (w->flat.state == FLAT_CPU_COPY)
    snprintf(buf, len, "rank %s, the leader of this rank's CPU, to write the CPU's result of round %llu of %llu "
             "(flat reduction by CPU)", ranks, round, nrounds);
  else
    snprintf(buf, len, "rank(s) %s to reach the shared-memory barrier %s round %llu of %llu (flat %s reduction)",
             ranks, w->flat.state == FLAT_CPU_SUM ? "of" : w->flat.state == FLAT_REDUCE ? "before" : "after", round,
             nrounds, w->flat.by_cpu ? "by CPU" : "slice");
}

ncclResult_t flat_check_crossed(const struct work *w) {
  struct shm_arena *a = w->comm->arena;
  if (!a || w->task->coll == COLL_SEND || w->task->coll == COLL_RECV)
    return ncclSuccess;
  /* Ranks that make the same call choose the same algorithm and protocol:
   * a header of this call's number in the arena that is another call is
   * a mismatch even where this rank's call runs over FIFOs, which show it
   * only once the peer sends on them. */
  struct slot_hdr want, got;
  slot_expect(w->task, w->seq, &want);
  for (int r = 0; r < a->nranks; r++) {
    if (r == a->me)
      continue;
    struct arena_rank *x = &a->ranks[r];
    for (int p = 0; p < 2; p++) {
      int seen = 0;
      if (arena_hdr_read(&x->call[p].flag, &x->call[p].hdr, &got) && got.seq == w->seq) {
        CHECK(slot_check_crossed(&want, &got, a->me, r));
        /* By CPU, a rank waits for the rank before it on its CPU, which
         * never adds where it goes by slices: only its header says so. */
        if (w->flat.on && !w->flat.whole && (got.where == SLOT_BY_CPU) != w->flat.by_cpu)
          return mode_mismatch(w, r, got.where == SLOT_BY_CPU);
        seen = 1;
      }
      if (arena_hdr_read(&x->slot[p].flag, &x->slot[p].hdr, &got) && got.seq == w->seq) {
        CHECK(slot_check_crossed(&want, &got, a->me, r));
        seen = 1;
      }
      if (seen && !w->flat.on)
        return err_set(ncclInvalidUsage,
                       "rank %d runs collective #%llu flat in the shared-memory arena and rank %d over its "
                       "connections: the ranks chose differently for one call. An AllReduce whose buffers lie in "
                       "windows registered with NCCL_WIN_COLL_SYMMETRIC runs flat, so every rank must pass such "
                       "buffers to it, or none; NCCL_ALGO must also be the same on every rank",
                       r, (unsigned long long)w->seq, a->me);
    }
  }
  return ncclSuccess;
}
