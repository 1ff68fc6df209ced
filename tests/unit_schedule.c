/*
 * Ring schedules checked without transports: every rank's schedule is run
 * on simulated FIFOs of NCCL_STEPS slots (so a schedule that could
 * deadlock a real ring deadlocks here too) with sums of doubles, and the
 * results are compared with the definition of each collective.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms/schedule.h"
#include "core.h"
#include "enqueue.h"
#include "sched_ref.h"
#include "test.h"

#define MAXR 9

struct sim_fifo {
  double *slots[NCCL_STEPS];
  size_t len[NCCL_STEPS];
  unsigned head, tail;
};

struct sim_rank {
  struct schedule s[4];
  uint64_t step[4];
  size_t off[4];
  double *src, *dst;
};

/* Moves one piece of rank r's current step on channel c if it can. */
static int sim_piece(struct sim_rank *rk, int c, struct sim_fifo *in, struct sim_fifo *out, size_t piece) {
  /* As the executors do: expand the step reached, skip it if empty. */
  struct step cur;
  for (;; rk->step[c]++) {
    if (rk->step[c] >= rk->s[c].nsteps)
      return 0;
    sched_at(&rk->s[c], rk->step[c], &cur);
    if (cur.nelem > 0)
      break;
  }
  const struct step *st = &cur;
  int recv = step_recvs(st->kind), send = step_sends(st->kind);
  if (recv && in->tail == in->head)
    return 0;
  if (send && out->tail - out->head >= NCCL_STEPS)
    return 0;
  size_t n = LOOM_MIN(piece, st->nelem - rk->off[c]);
  double *inp = NULL;
  if (recv) {
    inp = in->slots[in->head % NCCL_STEPS];
    ASSERT_MSG(in->len[in->head % NCCL_STEPS] == n, "piece sizes disagree: got %zu expected %zu",
               in->len[in->head % NCCL_STEPS], n);
  }
  double *o = send ? out->slots[out->tail % NCCL_STEPS] : NULL;
  double *src = rk->src + st->src_off + rk->off[c];
  double *dst = rk->dst + st->dst_off + rk->off[c];
  for (size_t i = 0; i < n; i++) {
    double v;
    switch (st->kind) {
    case STEP_SEND: v = src[i]; break;
    case STEP_COPY_SEND: case STEP_COPY: v = src[i]; dst[i] = v; break;
    case STEP_RECV: case STEP_RECV_COPY_SEND: v = inp[i]; dst[i] = v; break;
    case STEP_RECV_REDUCE_SEND: v = inp[i] + src[i]; break;
    default: v = inp[i] + src[i]; dst[i] = v; break;
    }
    if (o)
      o[i] = v;
  }
  if (send)
    out->len[out->tail++ % NCCL_STEPS] = n;
  if (recv)
    in->head++;
  rk->off[c] += n;
  if (rk->off[c] == st->nelem) {
    rk->step[c]++;
    rk->off[c] = 0;
  }
  return 1;
}

/* ---- the loops' expansion against the reference (sched_ref.h) ---- */

/* Takes the reference's steps one by one and compares each with the next
 * non-empty step of the schedule; adds up the slots of `piece` elements
 * that each peer moves, for schedule_slots. */
struct cmp_sink {
  struct ref_sink base;
  const struct schedule *s;
  const char *what;
  uint64_t k, nref, piece;
  uint64_t sends[WORK_MAX_PEERS], recvs[WORK_MAX_PEERS];
};

static void cmp_push(struct ref_sink *b, const struct step *want) {
  struct cmp_sink *c = (struct cmp_sink *)b;
  struct step got;
  do {
    ASSERT_MSG(c->k < c->s->nsteps, "%s: the schedule ends after %llu steps, the reference has more", c->what,
               (unsigned long long)c->nref);
    sched_at(c->s, c->k++, &got);
  } while (got.nelem == 0);
  ASSERT_MSG(got.kind == want->kind && got.flags == want->flags && got.si == want->si && got.ri == want->ri &&
                 got.src_off == want->src_off && got.dst_off == want->dst_off && got.nelem == want->nelem,
             "%s: step %llu is %s flags %d peers %d/%d src %llu dst %llu n %llu; the reference's is %s flags %d "
             "peers %d/%d src %llu dst %llu n %llu",
             c->what, (unsigned long long)c->nref, step_name(got.kind), got.flags, got.si, got.ri,
             (unsigned long long)got.src_off, (unsigned long long)got.dst_off, (unsigned long long)got.nelem,
             step_name(want->kind), want->flags, want->si, want->ri, (unsigned long long)want->src_off,
             (unsigned long long)want->dst_off, (unsigned long long)want->nelem);
  uint64_t slots = want->nelem / c->piece + (want->nelem % c->piece != 0);
  if (step_sends(want->kind))
    c->sends[want->si] += slots;
  if (step_recvs(want->kind))
    c->recvs[want->ri] += slots;
  c->nref++;
}

static void cmp_begin(struct cmp_sink *c, const struct schedule *s, uint64_t piece, const char *what) {
  memset(c, 0, sizeof *c);
  c->base.push = cmp_push;
  c->s = s;
  c->piece = piece;
  c->what = what;
}

/* What is left of the schedule must be empty, and schedule_slots must
 * agree with the slots the reference's steps take. */
static void cmp_end(struct cmp_sink *c) {
  for (; c->k < c->s->nsteps; c->k++) {
    struct step got;
    sched_at(c->s, c->k, &got);
    ASSERT_MSG(got.nelem == 0, "%s: the schedule has a step %llu (%s, %llu elements) past the reference's %llu",
               c->what, (unsigned long long)c->k, step_name(got.kind), (unsigned long long)got.nelem,
               (unsigned long long)c->nref);
  }
  uint64_t sends[WORK_MAX_PEERS] = {0}, recvs[WORK_MAX_PEERS] = {0};
  schedule_slots(c->s, c->piece, sends, recvs);
  for (int i = 0; i < WORK_MAX_PEERS; i++)
    ASSERT_MSG(sends[i] == c->sends[i] && recvs[i] == c->recvs[i],
               "%s: peer %d: schedule_slots says %llu slots sent, %llu received; the steps take %llu and %llu",
               c->what, i, (unsigned long long)sends[i], (unsigned long long)recvs[i],
               (unsigned long long)c->sends[i], (unsigned long long)c->recvs[i]);
}

/* What a schedule keeps does not grow with the count. */
static void check_bounded(const struct schedule *s, uint32_t max_tmpl, const char *what) {
  ASSERT_MSG(s->nloops <= SCHED_MAX_LOOPS && s->ntmpl <= max_tmpl && s->cap <= LOOM_MAX(16u, 2 * max_tmpl),
             "%s: %u loops, %u step templates stored (room for %u); at most %u expected", what, s->nloops, s->ntmpl,
             s->cap, max_tmpl);
}

static void sched_compare_ring(const struct ring_args *a, const struct schedule *s) {
  char what[160];
  snprintf(what, sizeof what, "ring coll %d rank index %d of %d, count %zu, range %zu+%zu, chunk %zu, align %zu",
           a->coll, a->index, a->nranks, a->count, a->off, a->len, a->chunk, a->align);
  check_bounded(s, 2 * (uint32_t)a->nranks, what);
  struct cmp_sink c;
  cmp_begin(&c, s, LOOM_MAX((size_t)1, a->chunk / 4), what);
  ref_ring(a, &c.base);
  cmp_end(&c);
}

static double input(int rank, size_t i) { return (double)((rank * 31 + (int)(i % 97)) % 13) - 6.0; }

static void check_coll(int coll, int n, size_t count, int nch, size_t piece, int root, const int *ring) {
  static struct sim_rank rk[MAXR];
  static struct sim_fifo fifo[4][MAXR]; /* fifo[c][r]: into rank r */
  size_t src_n = coll == COLL_REDUCESCATTER ? count * n : count;
  size_t dst_n = coll == COLL_ALLGATHER ? count * n : count;
  for (int r = 0; r < n; r++) {
    memset(&rk[r], 0, sizeof rk[r]);
    rk[r].src = calloc(src_n + 1, sizeof(double));
    rk[r].dst = calloc(dst_n + 1, sizeof(double));
    for (size_t i = 0; i < src_n; i++)
      rk[r].src[i] = input(r, i);
    int index = 0;
    for (int i = 0; i < n; i++)
      if (ring[i] == r)
        index = i;
    for (int c = 0; c < nch; c++) {
      struct ring_args a = {.coll = coll, .nranks = n, .ring = ring, .index = index, .root = root, .count = count,
                            .chunk = piece * (NCCL_STEPS / 2), .align = 4};
      schedule_channel_range(count, c, nch, 4, &a.off, &a.len);
      ASSERT(ring_schedule(&a, &rk[r].s[c]) == ncclSuccess);
      sched_compare_ring(&a, &rk[r].s[c]);
    }
  }
  for (int c = 0; c < nch; c++)
    for (int r = 0; r < n; r++) {
      memset(&fifo[c][r], 0, sizeof fifo[c][r]);
      for (int k = 0; k < NCCL_STEPS; k++)
        fifo[c][r].slots[k] = malloc(piece * sizeof(double));
    }
  int pos[MAXR];
  for (int i = 0; i < n; i++)
    pos[ring[i]] = i;
  for (;;) {
    int moved = 0, left = 0;
    for (int r = 0; r < n; r++)
      for (int c = 0; c < nch; c++) {
        int next = ring[(pos[r] + 1) % n];
        moved |= sim_piece(&rk[r], c, &fifo[c][r], &fifo[c][next], piece);
        left |= rk[r].step[c] < rk[r].s[c].nsteps;
      }
    if (!left)
      break;
    ASSERT_MSG(moved, "deadlock: coll %d n %d count %zu channels %d", coll, n, count, nch);
  }
  for (int c = 0; c < nch; c++)
    for (int r = 0; r < n; r++)
      ASSERT_MSG(fifo[c][r].head == fifo[c][r].tail, "coll %d leaves data in a FIFO", coll);
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < dst_n; i++) {
      double want = 0;
      switch (coll) {
      case COLL_ALLREDUCE:
        for (int q = 0; q < n; q++)
          want += input(q, i);
        break;
      case COLL_REDUCESCATTER:
        for (int q = 0; q < n; q++)
          want += input(q, (size_t)r * count + i);
        break;
      case COLL_ALLGATHER: want = input((int)(i / count), i % count); break;
      case COLL_BROADCAST: want = input(root, i); break;
      case COLL_REDUCE:
        if (r != root)
          continue;
        for (int q = 0; q < n; q++)
          want += input(q, i);
        break;
      }
      ASSERT_MSG(rk[r].dst[i] == want, "coll %d n %d count %zu ch %d piece %zu: rank %d element %zu is %g, want %g",
                 coll, n, count, nch, piece, r, i, rk[r].dst[i], want);
    }
  }
  for (int r = 0; r < n; r++) {
    for (int c = 0; c < nch; c++)
      schedule_free(&rk[r].s[c]);
    free(rk[r].src);
    free(rk[r].dst);
  }
  for (int c = 0; c < nch; c++)
    for (int r = 0; r < n; r++)
      for (int k = 0; k < NCCL_STEPS; k++)
        free(fifo[c][r].slots[k]);
}

TEST_IMPL(unit_schedule) {
  static const size_t counts[] = {1, 2, 7, 64, 100, 1000, 4097};
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_ALLGATHER, COLL_BROADCAST, COLL_REDUCE};
  int ring[MAXR];
  for (int n = 1; n <= 8; n++) {
    /* A ring that is not in rank order, as hosts make them. */
    for (int i = 0; i < n; i++)
      ring[i] = (i * 3 + 1) % n;
    int distinct = 1;
    for (int i = 0; i < n && distinct; i++)
      for (int j = 0; j < i; j++)
        if (ring[i] == ring[j])
          distinct = 0;
    if (!distinct)
      for (int i = 0; i < n; i++)
        ring[i] = n - 1 - i;
    for (size_t k = 0; k < sizeof colls / sizeof colls[0]; k++)
      for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (int nch = 1; nch <= 3; nch++)
          for (size_t piece = 4; piece <= 64; piece *= 4)
            check_coll(colls[k], n, counts[ci], nch, piece, (int)(counts[ci] % n), ring);
  }
  return 0;
}

/* A ring that is not in rank order, as hosts make them. */
static void make_ring(int n, int *ring) {
  for (int i = 0; i < n; i++)
    ring[i] = (i * 3 + 1) % n;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (ring[i] == ring[j]) {
        for (int k = 0; k < n; k++)
          ring[k] = n - 1 - k;
        return;
      }
}

static void compare_tree(int parent, int nchildren, size_t off, size_t len, size_t chunk, int check_peers) {
  static const int kids[WORK_MAX_PEERS] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  struct schedule s = {0};
  struct sched_peers pe;
  char what[160];
  snprintf(what, sizeof what, "tree parent %d, %d children, range %zu+%zu, chunk %zu", parent, nchildren, off, len,
           chunk);
  ASSERT_MSG(tree_schedule(parent, kids, nchildren, off, len, chunk, &s, &pe) == ncclSuccess, "%s", what);
  check_bounded(&s, 2 * ((uint32_t)nchildren + 1), what);
  if (check_peers)
    ASSERT_MSG(pe.nsend == nchildren + 1 && pe.send[0] == parent && (nchildren == 0 || pe.recv[1] == kids[0]), "%s",
               what);
  struct cmp_sink c;
  cmp_begin(&c, &s, LOOM_MAX((size_t)1, chunk / 2), what);
  ref_tree(parent, nchildren, off, len, chunk, &c.base);
  cmp_end(&c);
  schedule_free(&s);
}

static void compare_rd(int rank, int nranks, size_t count) {
  struct schedule s = {0};
  struct sched_peers pe;
  char what[96];
  snprintf(what, sizeof what, "recursive doubling rank %d of %d, count %zu", rank, nranks, count);
  ASSERT_MSG(rd_schedule(rank, nranks, count, &s, &pe) == ncclSuccess, "%s", what);
  check_bounded(&s, 2 * (uint32_t)WORK_MAX_PEERS, what);
  struct cmp_sink c;
  cmp_begin(&c, &s, 7, what);
  ref_rd(rank, nranks, count, &c.base);
  cmp_end(&c);
  schedule_free(&s);
}

static void compare_p2p(int coll, size_t count) {
  struct schedule s = {0};
  ASSERT(p2p_schedule(coll, count, &s) == ncclSuccess);
  check_bounded(&s, 1, "p2p");
  struct cmp_sink c;
  cmp_begin(&c, &s, 1000, "p2p");
  ref_p2p(coll, count, &c.base);
  cmp_end(&c);
  schedule_free(&s);
}

/* Every ring, tree, recursive doubling and point-to-point schedule of many
 * shapes expands, step for step, to what the step-by-step builders made;
 * schedule_slots agrees with the expanded steps' slots. */
TEST_IMPL(unit_schedule_reference) {
  static const size_t counts[] = {1, 2, 3, 7, 63, 64, 65, 100, 1000, 4097, 65536, 100003};
  static const size_t aligns[] = {1, 4, 16};
  static const size_t chunk_mul[] = {1, 3, 16, 250};
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_ALLGATHER, COLL_BROADCAST, COLL_REDUCE};
  int ring[MAXR];
  struct schedule s = {0};
  for (int n = 1; n <= MAXR; n++) {
    make_ring(n, ring);
    for (size_t k = 0; k < sizeof colls / sizeof colls[0]; k++)
      for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (size_t ai = 0; ai < sizeof aligns / sizeof aligns[0]; ai++)
          for (size_t mi = 0; mi < sizeof chunk_mul / sizeof chunk_mul[0]; mi++) {
            size_t chunk = aligns[ai] * chunk_mul[mi];
            if (counts[ci] / chunk > 2000)
              continue; /* the same loops as with a larger chunk, only slower */
            for (int nch = 1; nch <= 4; nch++)
              for (int index = 0; index < n; index++)
                for (int c = 0; c < nch; c++) {
                  struct ring_args a = {.coll = colls[k], .nranks = n, .ring = ring, .index = index,
                                        .root = (int)((counts[ci] + chunk) % (size_t)n), .count = counts[ci],
                                        .chunk = chunk, .align = aligns[ai]};
                  schedule_channel_range(counts[ci], c, nch, aligns[ai], &a.off, &a.len);
                  ASSERT(ring_schedule(&a, &s) == ncclSuccess); /* reusing one schedule's templates */
                  sched_compare_ring(&a, &s);
                }
          }
  }
  schedule_free(&s);
  for (int nchildren = 0; nchildren < WORK_MAX_PEERS; nchildren++)
    for (int parent = -1; parent <= 2; parent += 3)
      for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (size_t chunk = 1; chunk <= 4096; chunk *= 8)
          if (counts[ci] / chunk <= 2000)
            compare_tree(parent, nchildren, counts[ci] / 3, counts[ci], chunk, 1);
  for (int n = 2; n <= 40; n++)
    for (int r = 0; r < n; r++) {
      compare_rd(r, n, 1);
      compare_rd(r, n, 1000);
    }
  compare_p2p(COLL_SEND, 1);
  compare_p2p(COLL_RECV, 12345);
  /* Channel ranges: as before where nothing overflows, and a partition of
   * the count where the old arithmetic would have. */
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
    for (int nch = 1; nch <= 32; nch++)
      for (int c = 0; c < nch; c++) {
        size_t off, len, total = counts[ci], align = 16;
        schedule_channel_range(total, c, nch, align, &off, &len);
        size_t per = LOOM_ALIGN_UP(LOOM_DIV_UP(total, (size_t)nch), align), o = per * (size_t)c;
        ASSERT_MSG(off == LOOM_MIN(o, total) && len == (o < total ? LOOM_MIN(per, total - o) : 0),
                   "channel %d of %d over %zu: %zu+%zu", c, nch, total, off, len);
      }
  static const size_t huge[] = {SIZE_MAX, SIZE_MAX - 1, (size_t)1 << 63, ((size_t)1 << 57) + 1};
  for (size_t hi = 0; hi < sizeof huge / sizeof huge[0]; hi++)
    for (int nch = 1; nch <= 32; nch++) {
      size_t next = 0;
      for (int c = 0; c < nch; c++) {
        size_t off, len;
        schedule_channel_range(huge[hi], c, nch, 64, &off, &len);
        ASSERT_MSG(off == next && len <= huge[hi] - off, "channel %d of %d over %zu: %zu+%zu", c, nch, huge[hi], off,
                   len);
        next = off + len;
      }
      ASSERT_MSG(next == huge[hi], "%d channels cover %zu of %zu elements", nch, next, huge[hi]);
    }
  return 0;
}

/* A huge count is planned in the memory of a small one, and expands to
 * the same steps the step-by-step builders made: 2^40 (and a few) floats
 * over 8 ranks
 * with the chunks plan.c uses (a 4 MiB buffer: 2^17-float slots, chunks of
 * 4 slots, 2 for trees), every collective and algorithm, compared in full
 * on one channel of 4 for two ranks; and counts near the largest that
 * plan_check_size lets through keep the same bound. */
TEST_IMPL(unit_schedule_huge) {
  static const int colls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_ALLGATHER, COLL_BROADCAST, COLL_REDUCE};
  const int n = 8;
  /* Not a multiple of any chunk: the last loops are clipped. */
  const size_t slot = (size_t)1 << 17, align = 16, count = ((size_t)1 << 40) + 12289;
  int ring[MAXR];
  make_ring(n, ring);
  struct schedule s = {0};
  for (size_t k = 0; k < sizeof colls / sizeof colls[0]; k++)
    for (int index = 0; index < n; index++)
      for (int c = 0; c < 4; c++) {
        struct ring_args a = {.coll = colls[k], .nranks = n, .ring = ring, .index = index, .root = 3,
                              .count = count, .chunk = slot * 4, .align = align};
        schedule_channel_range(count, c, 4, align, &a.off, &a.len);
        ASSERT(ring_schedule(&a, &s) == ncclSuccess);
        char what[96];
        snprintf(what, sizeof what, "ring coll %d, 2^40+ elements, rank index %d, channel %d", colls[k], index, c);
        check_bounded(&s, 2 * (uint32_t)n, what);
        if (c == 1 && (index == 0 || index == 5))
          sched_compare_ring(&a, &s);
      }
  size_t off, len;
  schedule_channel_range(count, 1, 4, align, &off, &len);
  compare_tree(-1, 2, off, len, slot * 2, 0);
  compare_tree(2, 3, off, len, slot * 2, 0);
  compare_tree(2, 0, off, len, slot * 2, 0);
  compare_rd(5, 8, count);
  compare_rd(3, 6, count);
  compare_p2p(COLL_SEND, (size_t)1 << 57);
  /* The largest: 2^57 one-byte elements (2^54 for the gathered and
   * scattered sides' blocks), on 1 and 32 channels. */
  for (size_t k = 0; k < sizeof colls / sizeof colls[0]; k++)
    for (int index = 0; index < n; index++)
      for (int nch = 1; nch <= 32; nch += 31)
        for (int c = 0; c < nch; c++) {
          int blocks = colls[k] == COLL_ALLGATHER || colls[k] == COLL_REDUCESCATTER;
          size_t big = ((size_t)1 << (blocks ? 54 : 57)) - 1000;
          struct ring_args a = {.coll = colls[k], .nranks = n, .ring = ring, .index = index, .root = 0,
                                .count = big, .chunk = (slot * 4) << 2, .align = 64};
          schedule_channel_range(big, c, nch, 64, &a.off, &a.len);
          ASSERT(ring_schedule(&a, &s) == ncclSuccess);
          check_bounded(&s, 2 * (uint32_t)n, "ring, 2^57 bytes");
          /* Its last iteration ends where the channel's range does: in
           * the last step (a block of the gathered or scattered side), or
           * in one of the iteration's chunks. */
          struct step st;
          uint64_t top = 0, want = a.off + a.len;
          if (blocks) {
            sched_at(&s, s.nsteps - 1, &st);
            int owner = ring[colls[k] == COLL_ALLGATHER ? (index + 1) % n : index];
            top = (colls[k] == COLL_ALLGATHER ? st.dst_off : st.src_off) + st.nelem;
            want += (uint64_t)owner * big;
          } else {
            for (uint64_t i = s.nsteps - s.loops[s.nloops - 1].ntmpl; i < s.nsteps; i++) {
              sched_at(&s, i, &st);
              if (st.nelem)
                top = LOOM_MAX(top, st.src_off + st.nelem);
            }
          }
          ASSERT_MSG(a.len == 0 || top == want,
                     "coll %d rank index %d channel %d of %d: the last iteration ends at %llu, not %llu", colls[k],
                     index, c, nch, (unsigned long long)top, (unsigned long long)want);
          uint64_t sends[WORK_MAX_PEERS] = {0}, recvs[WORK_MAX_PEERS] = {0};
          schedule_slots(&s, slot, sends, recvs); /* closed form: instant */
        }
  struct sched_peers pe;
  ASSERT(tree_schedule(2, (const int[]){4, 5, 6}, 3, 0, (size_t)1 << 57, slot * 2, &s, &pe) == ncclSuccess);
  check_bounded(&s, 8, "tree, 2^57 bytes");
  schedule_free(&s);
  return 0;
}
