/*
 * The reference schedules of sched_ref.h: the step-by-step builders Loom
 * had before schedules became loops over chunks, kept as they were but for
 * where the steps go.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "sched_ref.h"

#include "core.h"
#include "enqueue.h"

static void push(struct ref_sink *k, int kind, int flags, int si, int ri, size_t src, size_t dst, size_t n) {
  if (n == 0)
    return; /* both ends of a connection skip the same empty chunks */
  struct step st = {.kind = (uint8_t)kind, .flags = (uint8_t)flags, .si = (uint8_t)si, .ri = (uint8_t)ri,
                    .src_off = src, .dst_off = dst, .nelem = n};
  k->push(k, &st);
}

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

static void allreduce_loop(const struct ring_args *a, struct ref_sink *s, size_t base, size_t lc) {
  int n = a->nranks, i = a->index;
  size_t end = a->off + a->len;
#define CHUNK_OFF(j) (LOOM_MIN(base + (size_t)(j) * lc, end))
#define CHUNK_LEN(j) (LOOM_MIN(base + (size_t)(j) * lc + lc, end) - CHUNK_OFF(j))
  int c = mod(i - 1, n);
  push(s, STEP_SEND, 0, 0, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c));
  for (int k = 1; k <= n - 2; k++) {
    c = mod(i - k - 1, n);
    push(s, STEP_RECV_REDUCE_SEND, 0, 0, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c));
  }
  c = i;
  push(s, STEP_RECV_REDUCE_COPY_SEND, STEP_FINAL, 0, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c));
  for (int m = 1; m <= n - 2; m++) {
    c = mod(i - m, n);
    push(s, STEP_RECV_COPY_SEND, 0, 0, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c));
  }
  c = mod(i + 1, n);
  push(s, STEP_RECV, 0, 0, 0, CHUNK_OFF(c), CHUNK_OFF(c), CHUNK_LEN(c));
#undef CHUNK_OFF
#undef CHUNK_LEN
}

static void allreduce(const struct ring_args *a, struct ref_sink *s) {
  size_t n = (size_t)a->nranks;
  for (size_t base = a->off; base < a->off + a->len;) {
    size_t left = a->off + a->len - base;
    size_t lc = LOOM_MIN(a->chunk, LOOM_ALIGN_UP(LOOM_DIV_UP(left, n), a->align));
    allreduce_loop(a, s, base, lc);
    base += LOOM_MIN(left, lc * n);
  }
}

#define BLOCK(c) ((size_t)a->ring[(c)] * a->count + base)

static void reduce_scatter(const struct ring_args *a, struct ref_sink *s) {
  int n = a->nranks, i = a->index;
  for (size_t base = a->off; base < a->off + a->len; base += a->chunk) {
    size_t lc = LOOM_MIN(a->chunk, a->off + a->len - base);
    push(s, STEP_SEND, 0, 0, 0, BLOCK(mod(i - 1, n)), 0, lc);
    for (int k = 1; k <= n - 2; k++)
      push(s, STEP_RECV_REDUCE_SEND, 0, 0, 0, BLOCK(mod(i - k - 1, n)), 0, lc);
    push(s, STEP_RECV_REDUCE_COPY, STEP_FINAL, 0, 0, BLOCK(i), base, lc);
  }
}

static void all_gather(const struct ring_args *a, struct ref_sink *s) {
  int n = a->nranks, i = a->index;
  for (size_t base = a->off; base < a->off + a->len; base += a->chunk) {
    size_t lc = LOOM_MIN(a->chunk, a->off + a->len - base);
    push(s, STEP_COPY_SEND, 0, 0, 0, base, BLOCK(i), lc);
    for (int k = 1; k <= n - 2; k++)
      push(s, STEP_RECV_COPY_SEND, 0, 0, 0, 0, BLOCK(mod(i - k, n)), lc);
    push(s, STEP_RECV, 0, 0, 0, 0, BLOCK(mod(i + 1, n)), lc);
  }
}

#undef BLOCK

static int ring_index_of(const struct ring_args *a, int rank) {
  for (int i = 0; i < a->nranks; i++)
    if (a->ring[i] == rank)
      return i;
  return 0;
}

static void chain(const struct ring_args *a, struct ref_sink *s, int kind, int flags) {
  for (size_t base = a->off; base < a->off + a->len; base += a->chunk)
    push(s, kind, flags, 0, 0, base, base, LOOM_MIN(a->chunk, a->off + a->len - base));
}

void ref_ring(const struct ring_args *a, struct ref_sink *s) {
  int n = a->nranks;
  if (a->len == 0)
    return;
  if (n == 1) {
    push(s, STEP_COPY, STEP_FINAL, 0, 0, a->off, a->off, a->len);
    return;
  }
  switch (a->coll) {
  case COLL_ALLREDUCE: allreduce(a, s); break;
  case COLL_REDUCESCATTER: reduce_scatter(a, s); break;
  case COLL_ALLGATHER: all_gather(a, s); break;
  case COLL_BROADCAST: {
    int p = mod(a->index - ring_index_of(a, a->root), n);
    chain(a, s, p == 0 ? STEP_COPY_SEND : p == n - 1 ? STEP_RECV : STEP_RECV_COPY_SEND, 0);
    break;
  }
  case COLL_REDUCE: {
    int q = mod(a->index - ring_index_of(a, a->root) - 1, n);
    chain(a, s, q == 0 ? STEP_SEND : q == n - 1 ? STEP_RECV_REDUCE_COPY : STEP_RECV_REDUCE_SEND,
          q == n - 1 ? STEP_FINAL : 0);
    break;
  }
  default: /* Send and Recv have no ring schedule */
    break;
  }
}

void ref_tree(int parent, int nchildren, size_t off, size_t len, size_t chunk, struct ref_sink *out) {
  const int partial = STEP_SRC_DST | STEP_NO_PREMUL;
  for (size_t base = off; base < off + len; base += chunk) {
    size_t n = LOOM_MIN(chunk, off + len - base);
    if (nchildren == 0) {
      push(out, STEP_SEND, 0, 0, 0, base, base, n);
      continue;
    }
    for (int k = 0; k < nchildren; k++) {
      int last = k == nchildren - 1 && parent < 0 ? STEP_FINAL : 0;
      push(out, STEP_RECV_REDUCE_COPY, (k ? partial : 0) | last, 0, 1 + k, base, base, n);
    }
    if (parent >= 0)
      push(out, STEP_SEND, partial, 0, 0, base, base, n);
  }
  for (size_t base = off; base < off + len; base += chunk) {
    size_t n = LOOM_MIN(chunk, off + len - base);
    int k = 0;
    if (parent >= 0) {
      if (nchildren > 0) {
        push(out, STEP_RECV_COPY_SEND, 0, 1, 0, base, base, n);
        k = 1;
      } else {
        push(out, STEP_RECV, 0, 0, 0, base, base, n);
      }
    }
    for (; k < nchildren; k++)
      push(out, STEP_SEND, partial, 1 + k, 0, base, base, n);
  }
}

void ref_rd(int rank, int nranks, size_t count, struct ref_sink *out) {
  int p = 1, rounds = 0;
  while (p * 2 <= nranks) {
    p *= 2;
    rounds++;
  }
  if (rank >= p) {
    push(out, STEP_SEND, 0, 0, 0, 0, 0, count);
    push(out, STEP_RECV, 0, 0, 0, 0, 0, count);
    return;
  }
  int fold = rank + p < nranks, partial = 0;
  if (fold) {
    push(out, STEP_RECV_REDUCE_COPY, 0, 0, rounds, 0, 0, count);
    partial = STEP_SRC_DST | STEP_NO_PREMUL;
  }
  for (int k = 0; k < rounds; k++) {
    push(out, STEP_SEND, partial, k, 0, 0, 0, count);
    int last = k == rounds - 1 ? STEP_FINAL : 0;
    push(out, STEP_RECV_REDUCE_COPY, partial | last, 0, k, 0, 0, count);
    partial = STEP_SRC_DST | STEP_NO_PREMUL;
  }
  if (fold)
    push(out, STEP_SEND, partial, rounds, 0, 0, 0, count);
}

void ref_p2p(int coll, size_t count, struct ref_sink *out) {
  push(out, coll == COLL_SEND ? STEP_SEND : STEP_RECV, 0, 0, 0, 0, 0, count);
}
