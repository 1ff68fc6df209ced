/*
 * Data parallel training: every rank holds the whole model, computes
 * gradients on its own shard of each batch, and one ncclAllReduce (ncclAvg,
 * or ncclSum with the loss scaled by the whole batch) makes them the
 * gradient of the whole batch before every rank applies the same update.
 *
 * Checked at every step:
 *  - the ranks' weights are bit-identical: AllReduce Max and Min of a hash
 *    of each rank's weights must agree;
 *  - the loss matches a single-process run on the whole batch, which each
 *    rank computes for itself as the reference, within --rtol, and the
 *    weights stay within --wtol of the reference's. They are not
 *    bit-identical to it: a shard's mean followed by the mean over ranks
 *    rounds differently from one mean over the batch.
 *
 *   data_parallel --ranks 4 --steps 20
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
  int ranks, steps, batch, in, hidden, layers, classes, seed, sum, timeout;
  double lr, rtol, wtol;
} dp_opts;

/* Per step, reduced over ranks with Max. */
enum { T_STEP, T_COMPUTE, T_ALLREDUCE, T_UPDATE, T_WDIFF, T_COUNT };

static int build_dims(const dp_opts *o, int *dims)
{
  dims[0] = o->in;
  for (int k = 1; k < o->layers; k++)
    dims[k] = o->hidden;
  dims[o->layers] = o->classes;
  return o->layers;
}

static int rank_main(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  const dp_opts *o = arg;
  ncclComm_t comm;
  EX_NCCL(NULL, ncclCommInitRank(&comm, nranks, *id, rank));

  int dims[64];
  int total = build_dims(o, dims);
  const int shard = o->batch / nranks, row0 = rank * shard;
  ex_mlp model, ref;
  ex_acts acts, ref_acts;
  float *x = malloc((size_t)o->batch * o->in * sizeof(float));
  int *labels = malloc((size_t)o->batch * sizeof(int));
  if (ex_mlp_init(&model, dims, total, 0, total, (uint64_t)o->seed) ||
      ex_mlp_init(&ref, dims, total, 0, total, (uint64_t)o->seed) ||
      ex_acts_init(&acts, &model, shard) || ex_acts_init(&ref_acts, &ref, o->batch) || !x || !labels) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    return 1;
  }
  const ncclRedOp_t op = o->sum ? ncclSum : ncclAvg;
  /* With Sum each rank scales by the whole batch so that the sum over
   * ranks is the batch mean; with Avg by its shard, and Avg divides. */
  const float scale = 1.0f / (float)(o->sum ? o->batch : shard);

  if (rank == 0) {
    printf("data_parallel: %d ranks, model %d", nranks, dims[0]);
    for (int k = 1; k <= total; k++)
      printf("-%d", dims[k]);
    printf(" (%zu parameters), batch %d (%d per rank), %d steps, gradients by ncclAllReduce %s\n",
           model.nparams, o->batch, shard, o->steps, o->sum ? "ncclSum (loss scaled by the batch)" : "ncclAvg");
    ex_note_cpu_sharing(nranks);
    printf("%4s  %10s  %10s  %9s  %-22s  %10s  %8s  %9s\n", "step", "loss", "single", "|diff|",
           "weights across ranks", "max|w-ws|", "step ms", "allred ms");
  }

  int ok = 1;
  double worst_loss = 0.0, worst_w = 0.0, sums[T_COUNT] = {0};
  for (int step = 0; step < o->steps; step++) {
    ex_make_batch((uint64_t)o->seed, step, o->batch, o->in, o->classes, x, labels);

    /* The distributed step: forward and backward on this rank's shard,
     * AllReduce of all gradients in one call, the same update everywhere. */
    double t0 = ex_now();
    memcpy(acts.act[0], x + (size_t)row0 * o->in, (size_t)shard * o->in * sizeof(float));
    ex_mlp_zero_grad(&model);
    ex_mlp_forward(&model, &acts, 0, shard);
    double loss = ex_softmax_xent(acts.act[total], labels + row0, shard, o->classes, scale, acts.grad[total]);
    ex_mlp_backward(&model, &acts, 0, shard, 0);
    double t1 = ex_now();
    EX_NCCL(comm, ncclAllReduce(model.grads, model.grads, model.nparams, ncclFloat, op, comm, NULL));
    double t2 = ex_now();
    ex_mlp_sgd(&model, (float)o->lr);
    double t3 = ex_now();

    /* The reference: one process, the whole batch. */
    memcpy(ref_acts.act[0], x, (size_t)o->batch * o->in * sizeof(float));
    ex_mlp_zero_grad(&ref);
    ex_mlp_forward(&ref, &ref_acts, 0, o->batch);
    double ref_loss = ex_softmax_xent(ref_acts.act[total], labels, o->batch, o->classes,
                                      1.0f / (float)o->batch, ref_acts.grad[total]) / o->batch;
    ex_mlp_backward(&ref, &ref_acts, 0, o->batch, 0);
    ex_mlp_sgd(&ref, (float)o->lr);

    /* The checks, in one group: the calls run together and ncclGroupEnd
     * returns when all four results are in. */
    uint64_t hash = ex_hash_floats(model.params, model.nparams), hmax, hmin;
    double local[T_COUNT] = {t3 - t0, t1 - t0, t2 - t1, t3 - t2,
                             ex_max_abs_diff(model.params, ref.params, model.nparams)};
    double worst[T_COUNT], loss_sum;
    EX_NCCL(comm, ncclGroupStart());
    EX_NCCL(comm, ncclAllReduce(&hash, &hmax, 1, ncclUint64, ncclMax, comm, NULL));
    EX_NCCL(comm, ncclAllReduce(&hash, &hmin, 1, ncclUint64, ncclMin, comm, NULL));
    EX_NCCL(comm, ncclAllReduce(local, worst, T_COUNT, ncclDouble, ncclMax, comm, NULL));
    EX_NCCL(comm, ncclAllReduce(&loss, &loss_sum, 1, ncclDouble, ncclSum, comm, NULL));
    EX_NCCL(comm, ncclGroupEnd());

    /* Avg scaled each shard's loss by its shard, Sum by the batch; the
     * printed loss is the batch mean either way. */
    double dist_loss = loss_sum / o->batch;
    double ldiff = fabs(dist_loss - ref_loss);
    int same = hmax == hmin;
    int loss_ok = ldiff <= o->rtol * fabs(ref_loss);
    int w_ok = worst[T_WDIFF] <= o->wtol;
    ok = ok && same && loss_ok && w_ok;
    worst_loss = fmax(worst_loss, ldiff / fabs(ref_loss));
    worst_w = fmax(worst_w, worst[T_WDIFF]);
    if (step > 0 || o->steps == 1)
      for (int k = 0; k < T_COUNT; k++)
        sums[k] += worst[k];
    if (rank == 0)
      printf("%4d  %10.6f  %10.6f  %9.2e  %-22s  %10.2e  %8.2f  %9.3f%s\n", step, dist_loss, ref_loss, ldiff,
             same ? "bit-identical" : "DIFFERENT", worst[T_WDIFF], 1e3 * worst[T_STEP],
             1e3 * worst[T_ALLREDUCE], loss_ok && w_ok ? "" : "  <- beyond tolerance");
  }

  if (rank == 0) {
    int timed = o->steps > 1 ? o->steps - 1 : 1;
    printf("time per step: %.3f ms, of which compute %.3f, AllReduce of %zu floats %.3f (with the wait for the "
           "slowest rank), update %.3f (each the slowest rank's, mean of %d step%s%s)\n",
           1e3 * sums[T_STEP] / timed, 1e3 * sums[T_COMPUTE] / timed, model.nparams,
           1e3 * sums[T_ALLREDUCE] / timed, 1e3 * sums[T_UPDATE] / timed, timed,
           timed == 1 ? "" : "s", o->steps > 1 ? " after the first" : "");
    if (ok)
      printf("data_parallel: AGREE: weights bit-identical on all %d ranks at every step; loss within rtol %g of "
             "the single-process run (worst %.2e), weights within %g (worst %.2e)\n",
             nranks, o->rtol, worst_loss, o->wtol, worst_w);
    else
      printf("data_parallel: MISMATCH: see the steps marked above (rtol %g, wtol %g)\n", o->rtol, o->wtol);
  }
  EX_NCCL(comm, ncclCommDestroy(comm));
  ex_acts_free(&acts);
  ex_acts_free(&ref_acts);
  ex_mlp_free(&model);
  ex_mlp_free(&ref);
  free(x);
  free(labels);
  return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
  dp_opts o = {.ranks = 2, .steps = 10, .batch = 256, .in = 32, .hidden = 256, .layers = 3, .classes = 10,
               .seed = 1, .sum = 0, .timeout = 60, .lr = 0.05, .rtol = 1e-5, .wtol = 1e-5};
  const ex_opt opts[] = {
      {"ranks", EX_OPT_INT, &o.ranks, "number of ranks (processes) to start"},
      {"steps", EX_OPT_INT, &o.steps, "training steps"},
      {"batch", EX_OPT_INT, &o.batch, "rows per step over all ranks (a multiple of --ranks)"},
      {"in", EX_OPT_INT, &o.in, "input features"},
      {"hidden", EX_OPT_INT, &o.hidden, "width of the hidden layers"},
      {"layers", EX_OPT_INT, &o.layers, "dense layers"},
      {"classes", EX_OPT_INT, &o.classes, "output classes"},
      {"lr", EX_OPT_DOUBLE, &o.lr, "SGD learning rate"},
      {"seed", EX_OPT_INT, &o.seed, "seed of the weights and the data"},
      {"sum", EX_OPT_FLAG, &o.sum, "AllReduce with ncclSum (loss scaled by the whole batch) instead of ncclAvg"},
      {"rtol", EX_OPT_DOUBLE, &o.rtol, "relative tolerance on the loss against the single-process run"},
      {"wtol", EX_OPT_DOUBLE, &o.wtol, "absolute tolerance on the weights against the single-process run"},
      {"timeout", EX_OPT_INT, &o.timeout, "seconds each rank may run"},
      {NULL, 0, NULL, NULL}};
  ex_parse_args(argc, argv, "Data parallel training of a small MLP on host communicators.", opts);
  if (o.ranks >= 1 && o.batch % o.ranks) {
    fprintf(stderr, "%s: --batch %d is not a multiple of --ranks %d: every rank takes an equal shard\n", argv[0],
            o.batch, o.ranks);
    return 2;
  }
  if (o.ranks < 1 || o.steps < 1 || o.batch < o.ranks || o.layers < 1 || o.layers > 62 ||
      o.in < 1 || o.hidden < 1 || o.classes < 2 || o.timeout < 1) {
    fprintf(stderr, "%s: need ranks >= 1, steps >= 1, batch >= ranks, 1 <= layers <= 62, "
                    "classes >= 2, timeout >= 1\n", argv[0]);
    return 2;
  }
  /* Host communicators even where a GPU is visible: the buffers here are
   * host memory. */
  setenv("LOOM_DEVICE", "host", 1);
  return ex_run_ranks("data_parallel", o.ranks, (unsigned)o.timeout, rank_main, &o);
}
