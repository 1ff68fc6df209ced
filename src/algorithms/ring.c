/*
 * Ring algorithms, NCCL's way: the buffer is cut into loops of nranks
 * chunks; a reduce-scatter pass (each chunk travels the ring once, being
 * reduced) and, for AllReduce, an all-gather pass (the finished chunk
 * travels once more). Broadcast and Reduce are chains along the ring from
 * or to the root. Chunks are pipelined: a step can start as soon as the
 * first slot of its chunk arrives.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "algorithms/schedule.h"
#include "common/coll.h"

#include <string.h>

static inline int mod(int a, int n) {
  int r = a % n; /* not (a % n + n) % n, which overflows for n above INT_MAX / 2 */
  return r < 0 ? r + n : r;
}

#define REL (TMPL_REL_SRC | TMPL_REL_DST)

/* One iteration of AllReduce: chunk c is the iteration's c-th. */
static ncclResult_t allreduce_tmpl(const struct ring_args *a, struct schedule *s) {
  int n = a->nranks, i = a->index;
  CHECK(schedule_tmpl(s, STEP_SEND, 0, 0, 0, mod(i - 1, n), REL, 0, 0));
  for (int k = 1; k <= n - 2; k++)
    CHECK(schedule_tmpl(s, STEP_RECV_REDUCE_SEND, 0, 0, 0, mod(i - k - 1, n), REL, 0, 0));
  CHECK(schedule_tmpl(s, STEP_RECV_REDUCE_COPY_SEND, STEP_FINAL, 0, 0, i, REL, 0, 0));
  for (int m = 1; m <= n - 2; m++)
    CHECK(schedule_tmpl(s, STEP_RECV_COPY_SEND, 0, 0, 0, mod(i - m, n), REL, 0, 0));
  return schedule_tmpl(s, STEP_RECV, 0, 0, 0, mod(i + 1, n), REL, 0, 0);
}

/* Loops of nranks chunks of `chunk` elements over this channel's range,
 * then, for what is left, one loop whose chunks spread it evenly instead
 * of leaving one rank with all of it. */
static ncclResult_t allreduce(const struct ring_args *a, struct schedule *s, size_t end) {
  size_t n = (size_t)a->nranks, span;
  if (__builtin_mul_overflow(a->chunk, n, &span))
    return err_set(ncclInternalError, "ring AllReduce loops of %zu x %zu elements overflow", a->chunk, n);
  size_t full = a->len / span, left = a->len % span;
  if (full) {
    CHECK(schedule_loop(s, a->off, span, a->chunk, end, full));
    CHECK(allreduce_tmpl(a, s));
  }
  if (!left)
    return ncclSuccess;
  size_t lc = left / n + (left % n != 0);
  lc += (a->align - lc % a->align) % a->align; /* lc <= chunk here: no overflow */
  lc = LOOM_MIN(a->chunk, lc);
  size_t start = a->off + full * span;
  if (full)
    return schedule_loop_again(s, start, lc * n, lc, end, 1);
  CHECK(schedule_loop(s, start, lc * n, lc, end, 1));
  return allreduce_tmpl(a, s);
}

/* ReduceScatter and AllGather work on each rank's block of `count`
 * elements; the chunk at ring position c is block ring[c]. Iterations are
 * one chunk each. */
static ncclResult_t block_of(const struct ring_args *a, int c, size_t *out) {
  if (__builtin_mul_overflow((size_t)a->ring[c], a->count, out))
    return err_set(ncclInternalError, "block %d of %zu elements overflows", a->ring[c], a->count);
  return ncclSuccess;
}

static ncclResult_t reduce_scatter(const struct ring_args *a, struct schedule *s) {
  int n = a->nranks, i = a->index;
  size_t b;
  CHECK(block_of(a, mod(i - 1, n), &b));
  CHECK(schedule_tmpl(s, STEP_SEND, 0, 0, 0, 0, TMPL_REL_SRC, b, 0));
  for (int k = 1; k <= n - 2; k++) {
    CHECK(block_of(a, mod(i - k - 1, n), &b));
    CHECK(schedule_tmpl(s, STEP_RECV_REDUCE_SEND, 0, 0, 0, 0, TMPL_REL_SRC, b, 0));
  }
  CHECK(block_of(a, i, &b));
  return schedule_tmpl(s, STEP_RECV_REDUCE_COPY, STEP_FINAL, 0, 0, 0, REL, b, 0);
}

static ncclResult_t all_gather(const struct ring_args *a, struct schedule *s) {
  int n = a->nranks, i = a->index;
  size_t b;
  CHECK(block_of(a, i, &b));
  CHECK(schedule_tmpl(s, STEP_COPY_SEND, 0, 0, 0, 0, REL, 0, b));
  for (int k = 1; k <= n - 2; k++) {
    CHECK(block_of(a, mod(i - k, n), &b));
    CHECK(schedule_tmpl(s, STEP_RECV_COPY_SEND, 0, 0, 0, 0, TMPL_REL_DST, 0, b));
  }
  CHECK(block_of(a, mod(i + 1, n), &b));
  return schedule_tmpl(s, STEP_RECV, 0, 0, 0, 0, TMPL_REL_DST, 0, b);
}

static int ring_index_of(const struct ring_args *a, int rank) {
  for (int i = 0; i < a->nranks; i++)
    if (a->ring[i] == rank)
      return i;
  return 0;
}

/* A chain from the root along the ring. */
static ncclResult_t broadcast(const struct ring_args *a, struct schedule *s) {
  int n = a->nranks;
  int p = mod(a->index - ring_index_of(a, a->root), n);
  int kind = p == 0 ? STEP_COPY_SEND : p == n - 1 ? STEP_RECV : STEP_RECV_COPY_SEND;
  return schedule_tmpl(s, kind, 0, 0, 0, 0, REL, 0, 0);
}

/* A chain along the ring that ends at the root. */
static ncclResult_t reduce(const struct ring_args *a, struct schedule *s) {
  int n = a->nranks;
  int q = mod(a->index - ring_index_of(a, a->root) - 1, n);
  int kind = q == 0 ? STEP_SEND : q == n - 1 ? STEP_RECV_REDUCE_COPY : STEP_RECV_REDUCE_SEND;
  return schedule_tmpl(s, kind, q == n - 1 ? STEP_FINAL : 0, 0, 0, 0, REL, 0, 0);
}

static ncclResult_t build(const struct ring_args *a, struct schedule *out, size_t end) {
  if (a->nranks == 1) {
    /* Alone, every collective is a copy, but Avg and PreMulSum still apply. */
    CHECK(schedule_loop(out, a->off, a->len, a->len, end, 1));
    return schedule_tmpl(out, STEP_COPY, STEP_FINAL, 0, 0, 0, REL, 0, 0);
  }
  if (a->coll == COLL_ALLREDUCE)
    return allreduce(a, out, end);
  /* The others: one chunk per iteration, the last one clipped. */
  CHECK(schedule_loop(out, a->off, a->chunk, a->chunk, end, a->len / a->chunk + (a->len % a->chunk != 0)));
  switch (a->coll) {
  case COLL_REDUCESCATTER: return reduce_scatter(a, out);
  case COLL_ALLGATHER: return all_gather(a, out);
  case COLL_BROADCAST: return broadcast(a, out);
  case COLL_REDUCE: return reduce(a, out);
  default: return err_set(ncclInternalError, "no ring schedule for collective %d", a->coll);
  }
}

ncclResult_t ring_schedule(const struct ring_args *a, struct schedule *out) {
  schedule_clear(out); /* keeps the template buffer of an earlier schedule */
  if (a->len == 0)
    return ncclSuccess;
  size_t end;
  if (a->chunk == 0 || a->align == 0 || a->nranks < 1 || a->index < 0 || a->index >= a->nranks ||
      __builtin_add_overflow(a->off, a->len, &end))
    return err_set(ncclInternalError, "ring schedule asked for with chunk %zu, align %zu, nranks %d, range %zu+%zu",
                   a->chunk, a->align, a->nranks, a->off, a->len);
  return schedule_finish(out, build(a, out, end));
}
