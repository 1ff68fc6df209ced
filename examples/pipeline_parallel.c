/*
 * Pipeline parallel training: the layers split across the ranks as in
 * model_parallel.c (each rank one pipeline stage), and each batch cut into
 * m micro-batches so that the stages work on different micro-batches at
 * once. Two schedules:
 *  - GPipe: every stage runs the forward pass of all micro-batches, then
 *    the backward pass of all of them;
 *  - 1F1B: after a warm-up of (p - 1 - stage) forwards, a stage alternates
 *    one forward and one backward, so it holds at most p micro-batches'
 *    activations instead of m. Its steady state has each stage sending an
 *    activation to the next stage while that one sends it a gradient: the
 *    two transfers go in one ncclGroupStart/End, or both ranks would wait
 *    in ncclSend for the other's ncclRecv.
 * Both leave the same idle time, the bubble: (p - 1) / (m + p - 1) of a
 * step when the stages are equal and communication is free. The example
 * measures it per stage as (step time - the stage's compute time) / step
 * time and prints it next to that formula for m = 1, 2, 4 and 8.
 *
 * The gradients accumulated over the micro-batches are checked against a
 * single process running the whole model on the whole batch (every rank
 * computes it as the reference). They are in fact bit-identical: the
 * weight gradients add the rows' terms in the same order either way
 * (mlp.c). The loss is summed per micro-batch, so it only matches within
 * rounding. The weights are not updated between the measured steps, so
 * that every schedule and micro-batch count computes the same gradient,
 * compared with one reference; data_parallel.c and model_parallel.c show
 * the update.
 *
 *   pipeline_parallel --ranks 4
 *
 * Runs on host communicators (LOOM_DEVICE=host, host buffers, stream NULL).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "common/mlp.h"
#include "common/ranks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int ranks, steps, batch, width, per_stage, seed, timeout;
  double rtol;
} pp_opts;

static const int micro_counts[] = {1, 2, 4, 8};
#define N_MICRO ((int)(sizeof micro_counts / sizeof micro_counts[0]))
enum { GPIPE, ONE_F_ONE_B, N_SCHED };
static const char *const sched_names[N_SCHED] = {"GPipe", "1F1B"};

/* One rank's pipeline stage and the time it spent computing. */
typedef struct {
  ncclComm_t comm;
  int rank, nranks, count, classes;
  ex_mlp *model;
  ex_acts *acts;
  const int *labels;
  int batch;
  double busy, loss;
} stage;

static int is_first(const stage *s) { return s->rank == 0; }
static int is_last(const stage *s) { return s->rank == s->nranks - 1; }

/* The rows [row0, row0 + rows) of a stage's input or output, activations
 * (act) or their gradients (grad). */
static float *rows_of(float *buf, int width, int row0) { return buf + (size_t)row0 * width; }
static size_t n_of(int width, int rows) { return (size_t)rows * width; }

/* The four transfers of a micro-batch; each is a no-op at the end of the
 * pipeline that has no peer for it. They may be called inside a group. */
static void recv_fwd(stage *s, int row0, int rows)
{
  if (!is_first(s))
    EX_NCCL(s->comm, ncclRecv(rows_of(s->acts->act[0], s->acts->width[0], row0), n_of(s->acts->width[0], rows),
                              ncclFloat, s->rank - 1, s->comm, NULL));
}

static void send_fwd(stage *s, int row0, int rows)
{
  int w = s->acts->width[s->count];
  if (!is_last(s))
    EX_NCCL(s->comm, ncclSend(rows_of(s->acts->act[s->count], w, row0), n_of(w, rows), ncclFloat, s->rank + 1,
                              s->comm, NULL));
}

static void recv_bwd(stage *s, int row0, int rows)
{
  int w = s->acts->width[s->count];
  if (!is_last(s))
    EX_NCCL(s->comm, ncclRecv(rows_of(s->acts->grad[s->count], w, row0), n_of(w, rows), ncclFloat, s->rank + 1,
                              s->comm, NULL));
}

static void send_bwd(stage *s, int row0, int rows)
{
  if (!is_first(s))
    EX_NCCL(s->comm, ncclSend(rows_of(s->acts->grad[0], s->acts->width[0], row0), n_of(s->acts->width[0], rows),
                              ncclFloat, s->rank - 1, s->comm, NULL));
}

static void forward(stage *s, int row0, int rows)
{
  double t = ex_now();
  ex_mlp_forward(s->model, s->acts, row0, rows);
  if (is_last(s)) {
    int w = s->acts->width[s->count];
    s->loss += ex_softmax_xent(rows_of(s->acts->act[s->count], w, row0), s->labels + row0, rows, s->classes,
                               1.0f / (float)s->batch, rows_of(s->acts->grad[s->count], w, row0));
  }
  s->busy += ex_now() - t;
}

static void backward(stage *s, int row0, int rows)
{
  double t = ex_now();
  /* Stage 0 computes the gradient of its input too, though nobody wants
   * it, so that all stages do equal work and the formula applies. */
  ex_mlp_backward(s->model, s->acts, row0, rows, 1);
  s->busy += ex_now() - t;
}

static void gpipe(stage *s, int m, int rows)
{
  for (int i = 0; i < m; i++) {
    recv_fwd(s, i * rows, rows);
    forward(s, i * rows, rows);
    send_fwd(s, i * rows, rows);
  }
  /* Backward in the forward order: the weight gradients then add the
   * rows in the order a single full-batch pass does. */
  for (int i = 0; i < m; i++) {
    recv_bwd(s, i * rows, rows);
    backward(s, i * rows, rows);
    send_bwd(s, i * rows, rows);
  }
}

static void one_f_one_b(stage *s, int m, int rows)
{
  int warmup = s->nranks - 1 - s->rank;
  warmup = warmup < m ? warmup : m;
  for (int i = 0; i < warmup; i++) {
    recv_fwd(s, i * rows, rows);
    forward(s, i * rows, rows);
    send_fwd(s, i * rows, rows);
  }
  if (warmup < m)
    recv_fwd(s, warmup * rows, rows);
  int steady = m - warmup;
  for (int k = 0; k < steady; k++) {
    int f = warmup + k; /* forward micro-batch f, backward micro-batch k */
    forward(s, f * rows, rows);
    /* The next stage is at the same point sending gradient k to us. */
    EX_NCCL(s->comm, ncclGroupStart());
    send_fwd(s, f * rows, rows);
    recv_bwd(s, k * rows, rows);
    EX_NCCL(s->comm, ncclGroupEnd());
    backward(s, k * rows, rows);
    EX_NCCL(s->comm, ncclGroupStart());
    send_bwd(s, k * rows, rows);
    if (k + 1 < steady)
      recv_fwd(s, (f + 1) * rows, rows);
    EX_NCCL(s->comm, ncclGroupEnd());
  }
  for (int k = steady; k < m; k++) {
    recv_bwd(s, k * rows, rows);
    backward(s, k * rows, rows);
    send_bwd(s, k * rows, rows);
  }
}

/* One way time of a micro-batch's activations from rank 0 to rank 1, from
 * a ping-pong, to show it is small next to the compute per micro-batch. */
static double ping_pong(stage *s, float *buf, size_t n)
{
  const int iters = 10;
  ex_barrier(s->comm);
  double t0 = ex_now();
  for (int i = 0; i < iters && s->nranks > 1 && s->rank < 2; i++) {
    if (s->rank == 0) {
      EX_NCCL(s->comm, ncclSend(buf, n, ncclFloat, 1, s->comm, NULL));
      EX_NCCL(s->comm, ncclRecv(buf, n, ncclFloat, 1, s->comm, NULL));
    } else {
      EX_NCCL(s->comm, ncclRecv(buf, n, ncclFloat, 0, s->comm, NULL));
      EX_NCCL(s->comm, ncclSend(buf, n, ncclFloat, 0, s->comm, NULL));
    }
  }
  return (ex_now() - t0) / (2.0 * iters);
}

static double max_abs(const float *v, size_t n)
{
  double worst = 0.0;
  for (size_t j = 0; j < n; j++)
    worst = fmax(worst, fabs((double)v[j]));
  return worst;
}

static int rank_main(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  const pp_opts *o = arg;
  ncclComm_t comm;
  EX_NCCL(NULL, ncclCommInitRank(&comm, nranks, *id, rank));

  /* Every layer width x width, and as many classes as features, so that
   * the stages do equal work. */
  const int total = o->per_stage * nranks;
  int *dims = malloc(((size_t)total + 1) * sizeof(int));
  float *x = malloc((size_t)o->batch * o->width * sizeof(float));
  int *labels = malloc((size_t)o->batch * sizeof(int));
  double *bubbles = malloc((size_t)nranks * sizeof(double));
  if (!dims || !x || !labels || !bubbles) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    return 1;
  }
  for (int k = 0; k <= total; k++)
    dims[k] = o->width;
  const int first = rank * o->per_stage, count = o->per_stage;
  ex_mlp model, ref;
  ex_acts acts, ref_acts;
  if (ex_mlp_init(&model, dims, total, first, count, (uint64_t)o->seed) ||
      ex_mlp_init(&ref, dims, total, 0, total, (uint64_t)o->seed) || ex_acts_init(&acts, &model, o->batch) ||
      ex_acts_init(&ref_acts, &ref, o->batch)) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    return 1;
  }
  ex_make_batch((uint64_t)o->seed, 0, o->batch, o->width, o->width, x, labels);

  /* The reference gradient: one process, the whole model, the whole batch. */
  memcpy(ref_acts.act[0], x, (size_t)o->batch * o->width * sizeof(float));
  ex_mlp_zero_grad(&ref);
  ex_mlp_forward(&ref, &ref_acts, 0, o->batch);
  double ref_loss = ex_softmax_xent(ref_acts.act[total], labels, o->batch, o->width, 1.0f / (float)o->batch,
                                    ref_acts.grad[total]) / o->batch;
  ex_mlp_backward(&ref, &ref_acts, 0, o->batch, 0);
  const float *ref_grads = ref.layers[first].gw; /* this stage's slice, same layout */
  const double grad_scale = max_abs(ref_grads, model.nparams);

  stage s = {.comm = comm, .rank = rank, .nranks = nranks, .count = count, .classes = o->width,
             .model = &model, .acts = &acts, .labels = labels, .batch = o->batch};
  const int max_m = micro_counts[N_MICRO - 1];
  double one_way = ping_pong(&s, acts.act[0], n_of(o->width, o->batch / max_m));

  if (rank == 0) {
    printf("pipeline_parallel: %d stages (one per rank), model of %d layers %d x %d (%d per stage), batch %d, "
           "%d timed step%s after a warm-up per row\n",
           nranks, total, o->width, o->width, o->per_stage, o->batch, o->steps, o->steps == 1 ? "" : "s");
    ex_note_cpu_sharing(nranks);
    if (nranks > 1)
      printf("one micro-batch of %d rows (m=%d) between two ranks: %.3f ms one way\n", o->batch / max_m, max_m,
             1e3 * one_way);
    printf("%-5s %2s %5s %9s %9s  %-*s %8s %9s  %s\n", "sched", "m", "rows", "step ms", "mb ms", 6 * nranks,
           "bubble per stage", "mean", "analytic", "grads vs single");
  }

  int ok = 1, all_bit_same = 1;
  double worst_grad = 0.0, worst_loss = 0.0;
  for (int sched = 0; sched < N_SCHED; sched++) {
    for (int mi = 0; mi < N_MICRO; mi++) {
      const int m = micro_counts[mi], rows = o->batch / m;
      /* The fastest of the timed steps is the one other processes
       * disturbed least; every rank picks the same one, since the span is
       * reduced over all of them. */
      double best_span = -1.0, best_bubble = 0.0, best_busy = 0.0;
      int row_same = 1;
      double row_grad = 0.0;
      for (int step = 0; step <= o->steps; step++) {
        ex_mlp_zero_grad(&model);
        if (is_first(&s))
          memcpy(acts.act[0], x, (size_t)o->batch * o->width * sizeof(float));
        s.busy = 0.0;
        s.loss = 0.0;
        /* All stages start together; CLOCK_MONOTONIC is one clock for the
         * whole host, so the step runs from the earliest start to the
         * latest end over the ranks. */
        ex_barrier(comm);
        double t_start = ex_now();
        if (sched == GPIPE)
          gpipe(&s, m, rows);
        else
          one_f_one_b(&s, m, rows);
        double t_end = ex_now();

        double loss = s.loss / o->batch;
        double diff = ex_max_abs_diff(model.grads, ref_grads, model.nparams);
        int same = memcmp(model.grads, ref_grads, model.nparams * sizeof(float)) == 0, all_same;
        double lo[2] = {-t_start, t_end}, hi[2], diffs = diff / (grad_scale > 0 ? grad_scale : 1.0), worst_diff;
        EX_NCCL(comm, ncclGroupStart());
        EX_NCCL(comm, ncclAllReduce(lo, hi, 2, ncclDouble, ncclMax, comm, NULL));
        EX_NCCL(comm, ncclAllReduce(&same, &all_same, 1, ncclInt32, ncclMin, comm, NULL));
        EX_NCCL(comm, ncclAllReduce(&diffs, &worst_diff, 1, ncclDouble, ncclMax, comm, NULL));
        EX_NCCL(comm, ncclBroadcast(&loss, &loss, 1, ncclDouble, nranks - 1, comm, NULL));
        EX_NCCL(comm, ncclGroupEnd());
        double span = hi[1] + hi[0]; /* latest end - earliest start */
        double bubble = span > 0 ? 1.0 - s.busy / span : 0.0;

        double ldiff = fabs(loss - ref_loss) / fabs(ref_loss);
        row_same = row_same && all_same;
        row_grad = fmax(row_grad, worst_diff);
        worst_loss = fmax(worst_loss, ldiff);
        ok = ok && worst_diff <= o->rtol && ldiff <= o->rtol;
        if (step > 0 && (best_span < 0 || span < best_span)) { /* step 0 warms up */
          best_span = span;
          best_bubble = bubble;
          best_busy = s.busy;
        }
      }
      all_bit_same = all_bit_same && row_same;
      worst_grad = fmax(worst_grad, row_grad);
      EX_NCCL(comm, ncclAllGather(&best_bubble, bubbles, 1, ncclDouble, comm, NULL));
      if (rank == 0) {
        double avg = 0.0;
        char cells[512] = "";
        for (int r = 0; r < nranks; r++) {
          avg += bubbles[r] / nranks;
          size_t used = strlen(cells);
          snprintf(cells + used, sizeof cells - used, "%5.3f ", bubbles[r]);
        }
        char verdict[64];
        if (row_same)
          snprintf(verdict, sizeof verdict, "bit-identical");
        else
          snprintf(verdict, sizeof verdict, "%s (rel %.1e)", row_grad <= o->rtol ? "within rtol" : "DIFFERENT",
                   row_grad);
        printf("%-5s %2d %5d %9.2f %9.3f  %-*s %8.3f %9.3f  %s\n", sched_names[sched], m, rows,
               1e3 * best_span, 1e3 * best_busy / m, 6 * nranks, cells, avg,
               (double)(nranks - 1) / (m + nranks - 1), verdict);
      }
    }
  }

  if (rank == 0) {
    printf("(the fastest of the %d timed steps of each row; mb ms: rank 0's forward + backward compute per "
           "micro-batch; bubble: (step - the stage's compute) / step)\n", o->steps);
    if (ok)
      printf("pipeline_parallel: AGREE: gradients accumulated over 1, 2, 4 and 8 micro-batches match the "
             "full-batch single-process run within rtol %g with both schedules (%s); loss off by %.1e relative\n",
             o->rtol, all_bit_same ? "bit-identical" : "not all bit-identical", worst_loss);
    else
      printf("pipeline_parallel: MISMATCH: gradients (worst %.2e) or loss (worst %.2e) beyond rtol %g\n",
             worst_grad, worst_loss, o->rtol);
  }
  EX_NCCL(comm, ncclCommDestroy(comm));
  ex_acts_free(&acts);
  ex_acts_free(&ref_acts);
  ex_mlp_free(&model);
  ex_mlp_free(&ref);
  free(dims);
  free(x);
  free(labels);
  free(bubbles);
  return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
  pp_opts o = {.ranks = 2, .steps = 3, .batch = 128, .width = 256, .per_stage = 2, .seed = 1, .timeout = 120,
               .rtol = 1e-5};
  const ex_opt opts[] = {
      {"ranks", EX_OPT_INT, &o.ranks, "number of ranks (processes), one pipeline stage each"},
      {"steps", EX_OPT_INT, &o.steps, "timed steps per schedule and micro-batch count (after one warm-up)"},
      {"batch", EX_OPT_INT, &o.batch, "rows per step, a multiple of 8 (cut into 1, 2, 4 and 8 micro-batches)"},
      {"width", EX_OPT_INT, &o.width, "features, classes and width of every layer"},
      {"per-stage", EX_OPT_INT, &o.per_stage, "dense layers per stage"},
      {"seed", EX_OPT_INT, &o.seed, "seed of the weights and the data"},
      {"rtol", EX_OPT_DOUBLE, &o.rtol, "tolerance on gradients (relative to the largest) and loss"},
      {"timeout", EX_OPT_INT, &o.timeout, "seconds each rank may run"},
      {NULL, 0, NULL, NULL}};
  ex_parse_args(argc, argv, "Pipeline parallel training of a small MLP on host communicators: GPipe and 1F1B, "
                            "bubble fraction against (p-1)/(m+p-1).", opts);
  if (o.ranks < 1 || o.steps < 1 || o.batch < 8 || o.batch % 8 || o.width < 2 || o.per_stage < 1 ||
      o.timeout < 1) {
    fprintf(stderr, "%s: need ranks >= 1, steps >= 1, batch a multiple of 8, width >= 2, per-stage >= 1, "
                    "timeout >= 1\n", argv[0]);
    return 2;
  }
  setenv("LOOM_DEVICE", "host", 1);
  return ex_run_ranks("pipeline_parallel", o.ranks, (unsigned)o.timeout, rank_main, &o);
}
