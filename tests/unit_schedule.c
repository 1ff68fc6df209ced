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
#include "test.h"

#define MAXR 9

struct sim_fifo {
  double *slots[NCCL_STEPS];
  size_t len[NCCL_STEPS];
  unsigned head, tail;
};

struct sim_rank {
  struct schedule s[4];
  int step[4];
  size_t off[4];
  double *src, *dst;
};

/* Moves one piece of rank r's current step on channel c if it can. */
static int sim_piece(struct sim_rank *rk, int c, struct sim_fifo *in, struct sim_fifo *out, size_t piece) {
  if (rk->step[c] >= rk->s[c].nsteps)
    return 0;
  const struct step *st = &rk->s[c].steps[rk->step[c]];
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
