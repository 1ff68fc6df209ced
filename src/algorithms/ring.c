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
#include "enqueue.h"

#include <string.h>

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* One loop of AllReduce over [base, base + n*lc) of this channel's range:
 * chunk j is [base + j*lc, ...) clipped to the range end. */
static ncclResult_t allreduce_loop(const struct ring_args *a, struct schedule *s, size_t base, size_t lc) {
  int n = a->nranks, i = a->index;
  size_t end = a->off + a->len;
#define CHUNK_OFF(j) (LOOM_MIN(base + (size_t)(j) * lc, end))
#define CHUNK_LEN(j) (LOOM_MIN(base + (size_t)(j) * lc + lc, end) - CHUNK_OFF(j))
  int c = mod(i - 1, n);
  CHECK(schedule_push(s, STEP_SEND, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c)));
  for (int k = 1; k <= n - 2; k++) {
    c = mod(i - k - 1, n);
    CHECK(schedule_push(s, STEP_RECV_REDUCE_SEND, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c)));
  }
  c = i;
  CHECK(schedule_push(s, STEP_RECV_REDUCE_COPY_SEND, STEP_FINAL, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c)));
  for (int m = 1; m <= n - 2; m++) {
    c = mod(i - m, n);
    CHECK(schedule_push(s, STEP_RECV_COPY_SEND, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c)));
  }
  c = mod(i + 1, n);
  CHECK(schedule_push(s, STEP_RECV, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c)));
#undef CHUNK_OFF
#undef CHUNK_LEN
  return ncclSuccess;
}

static ncclResult_t allreduce(const struct ring_args *a, struct schedule *s) {
  size_t n = (size_t)a->nranks;
  for (size_t base = a->off; base < a->off + a->len;) {
    size_t left = a->off + a->len - base;
    /* The last loop spreads what is left evenly over the chunks instead of
     * leaving one rank with all of it. */
    size_t lc = LOOM_MIN(a->chunk, LOOM_ALIGN_UP(LOOM_DIV_UP(left, n), a->align));
    CHECK(allreduce_loop(a, s, base, lc));
    base += LOOM_MIN(left, lc * n);
  }
  return ncclSuccess;
}

/* ReduceScatter and AllGather work on each rank's block of `count`
 * elements; the chunk at ring position c is block ring[c]. */
static ncclResult_t reduce_scatter(const struct ring_args *a, struct schedule *s) {
  int n = a->nranks, i = a->index;
  for (size_t base = a->off; base < a->off + a->len; base += a->chunk) {
    size_t lc = LOOM_MIN(a->chunk, a->off + a->len - base);
#define BLOCK(c) ((size_t)a->ring[(c)] * a->count + base)
    CHECK(schedule_push(s, STEP_SEND, 0, BLOCK(mod(i - 1, n)), 0, lc));
    for (int k = 1; k <= n - 2; k++)
      CHECK(schedule_push(s, STEP_RECV_REDUCE_SEND, 0, BLOCK(mod(i - k - 1, n)), 0, lc));
    CHECK(schedule_push(s, STEP_RECV_REDUCE_COPY, STEP_FINAL, BLOCK(i), base, lc));
  }
  return ncclSuccess;
}

static ncclResult_t all_gather(const struct ring_args *a, struct schedule *s) {
  int n = a->nranks, i = a->index;
  for (size_t base = a->off; base < a->off + a->len; base += a->chunk) {
    size_t lc = LOOM_MIN(a->chunk, a->off + a->len - base);
    CHECK(schedule_push(s, STEP_COPY_SEND, 0, base, BLOCK(i), lc));
    for (int k = 1; k <= n - 2; k++)
      CHECK(schedule_push(s, STEP_RECV_COPY_SEND, 0, 0, BLOCK(mod(i - k, n)), lc));
    CHECK(schedule_push(s, STEP_RECV, 0, 0, BLOCK(mod(i + 1, n)), lc));
#undef BLOCK
  }
  return ncclSuccess;
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
  for (size_t base = a->off; base < a->off + a->len; base += a->chunk)
    CHECK(schedule_push(s, kind, 0, base, base, LOOM_MIN(a->chunk, a->off + a->len - base)));
  return ncclSuccess;
}

/* A chain along the ring that ends at the root. */
static ncclResult_t reduce(const struct ring_args *a, struct schedule *s) {
  int n = a->nranks;
  int q = mod(a->index - ring_index_of(a, a->root) - 1, n);
  int kind = q == 0 ? STEP_SEND : q == n - 1 ? STEP_RECV_REDUCE_COPY : STEP_RECV_REDUCE_SEND;
  int flags = q == n - 1 ? STEP_FINAL : 0;
  for (size_t base = a->off; base < a->off + a->len; base += a->chunk)
    CHECK(schedule_push(s, kind, flags, base, base, LOOM_MIN(a->chunk, a->off + a->len - base)));
  return ncclSuccess;
}

ncclResult_t ring_schedule(const struct ring_args *a, struct schedule *out) {
  out->nsteps = 0; /* keeps the steps buffer of an earlier schedule */
  if (a->len == 0)
    return ncclSuccess;
  if (a->chunk == 0 || a->align == 0 || a->nranks < 1)
    return err_set(ncclInternalError, "ring schedule asked for with chunk %zu, align %zu, nranks %d", a->chunk,
                   a->align, a->nranks);
  ncclResult_t r;
  if (a->nranks == 1) {
    /* Alone, every collective is a copy, but Avg and PreMulSum still apply. */
    size_t src = a->off, dst = a->off;
    r = schedule_push(out, STEP_COPY, STEP_FINAL, src, dst, a->len);
  } else {
    switch (a->coll) {
    case COLL_ALLREDUCE: r = allreduce(a, out); break;
    case COLL_REDUCESCATTER: r = reduce_scatter(a, out); break;
    case COLL_ALLGATHER: r = all_gather(a, out); break;
    case COLL_BROADCAST: r = broadcast(a, out); break;
    case COLL_REDUCE: r = reduce(a, out); break;
    default: r = err_set(ncclInternalError, "no ring schedule for collective %d", a->coll);
    }
  }
  if (r != ncclSuccess)
    schedule_free(out);
  return r;
}
