/*
 * Model (layer) parallel training: the layers are split across the ranks,
 * rank 0 holding the first ones. Activations go forward from rank to rank
 * with ncclSend/ncclRecv, the last rank computes the loss, and the
 * gradients of the activations go back the same way; each rank updates the
 * layers it holds.
 *
 * The result is bit-identical to a single process running the whole model
 * (which every rank also computes, as the reference): the ranks run the
 * same functions on the same numbers in the same order, and send/recv only
 * copies bytes. So this example demands identity, not a tolerance: any
 * difference means a transfer delivered something else than was sent.
 *
 * Only one rank computes at a time here; pipeline_parallel.c cuts the batch
 * into micro-batches to overlap them.
 *
 *   model_parallel --ranks 4 --steps 10
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
  int ranks, steps, batch, in, hidden, layers, classes, seed, timeout;
  double lr;
} mp_opts;

/* Rank r holds layers [first, first + count): as even a split as L layers
 * over P ranks allows. */
static void split(int layers, int nranks, int rank, int *first, int *count)
{
  *first = rank * layers / nranks;
  *count = (rank + 1) * layers / nranks - *first;
}

static int rank_main(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  const mp_opts *o = arg;
  ncclComm_t comm;
  EX_NCCL(NULL, ncclCommInitRank(&comm, nranks, *id, rank));

  const int total = o->layers;
  int dims[130];
  dims[0] = o->in;
  for (int k = 1; k < total; k++)
    dims[k] = o->hidden;
  dims[total] = o->classes;
  int first, count;
  split(total, nranks, rank, &first, &count);
  const int last_rank = nranks - 1, is_last = rank == last_rank;

  ex_mlp model, ref;
  ex_acts acts, ref_acts;
  float *x = malloc((size_t)o->batch * o->in * sizeof(float));
  int *labels = malloc((size_t)o->batch * sizeof(int));
  if (ex_mlp_init(&model, dims, total, first, count, (uint64_t)o->seed) ||
      ex_mlp_init(&ref, dims, total, 0, total, (uint64_t)o->seed) || ex_acts_init(&acts, &model, o->batch) ||
      ex_acts_init(&ref_acts, &ref, o->batch) || !x || !labels) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    return 1;
  }
  /* This rank's layers are one contiguous run of the reference's
   * parameters, laid out the same way. */
  const float *ref_mine = ref.layers[first].w;
  const size_t in_count = (size_t)o->batch * acts.width[0];
  const size_t out_count = (size_t)o->batch * acts.width[count];

  if (rank == 0) {
    printf("model_parallel: %d ranks, model %d", nranks, dims[0]);
    for (int k = 1; k <= total; k++)
      printf("-%d", dims[k]);
    printf(" (%d layers), batch %d, %d steps; layers per rank:", total, o->batch, o->steps);
    for (int r = 0; r < nranks; r++) {
      int f, c;
      split(total, nranks, r, &f, &c);
      printf(" %d:[%d..%d]", r, f, f + c - 1);
    }
    printf("\n");
    ex_note_cpu_sharing(nranks);
    printf("%4s  %10s  %10s  %-13s  %-28s  %8s\n", "step", "loss", "single", "loss bits",
           "weights vs single (all ranks)", "step ms");
  }

  int ok = 1;
  double busy_sum = 0.0, step_sum = 0.0;
  for (int step = 0; step < o->steps; step++) {
    ex_make_batch((uint64_t)o->seed, step, o->batch, o->in, o->classes, x, labels);

    double t0 = ex_now(), busy = 0.0, t;
    /* Forward: the input comes from the data on rank 0, from the previous
     * rank elsewhere, straight into this rank's first activation buffer.
     * Each transfer goes one way between two ranks that are both waiting
     * for it, so the calls stand alone; where two ranks send to each other
     * at once they must be grouped (pipeline_parallel.c). */
    ex_mlp_zero_grad(&model);
    if (rank == 0)
      memcpy(acts.act[0], x, (size_t)o->batch * o->in * sizeof(float));
    else
      EX_NCCL(comm, ncclRecv(acts.act[0], in_count, ncclFloat, rank - 1, comm, NULL));
    t = ex_now();
    ex_mlp_forward(&model, &acts, 0, o->batch);
    double loss = 0.0;
    if (is_last)
      loss = ex_softmax_xent(acts.act[count], labels, o->batch, o->classes, 1.0f / (float)o->batch,
                             acts.grad[count]) / o->batch;
    busy += ex_now() - t;
    if (!is_last) {
      EX_NCCL(comm, ncclSend(acts.act[count], out_count, ncclFloat, rank + 1, comm, NULL));
      /* Backward: the gradient of this rank's output from the next rank. */
      EX_NCCL(comm, ncclRecv(acts.grad[count], out_count, ncclFloat, rank + 1, comm, NULL));
    }
    t = ex_now();
    ex_mlp_backward(&model, &acts, 0, o->batch, rank > 0);
    busy += ex_now() - t;
    if (rank > 0)
      EX_NCCL(comm, ncclSend(acts.grad[0], in_count, ncclFloat, rank - 1, comm, NULL));
    ex_mlp_sgd(&model, (float)o->lr);
    double elapsed = ex_now() - t0;

    /* The reference: the whole model, the whole batch, one process. */
    memcpy(ref_acts.act[0], x, (size_t)o->batch * o->in * sizeof(float));
    ex_mlp_zero_grad(&ref);
    ex_mlp_forward(&ref, &ref_acts, 0, o->batch);
    double ref_loss = ex_softmax_xent(ref_acts.act[total], labels, o->batch, o->classes,
                                      1.0f / (float)o->batch, ref_acts.grad[total]) / o->batch;
    ex_mlp_backward(&ref, &ref_acts, 0, o->batch, 0);
    ex_mlp_sgd(&ref, (float)o->lr);

    /* Everyone learns the loss from the last rank, whether all ranks'
     * weights are identical to the reference's, and the worst difference
     * and the slowest step, in one group. */
    int same = memcmp(model.params, ref_mine, model.nparams * sizeof(float)) == 0, all_same;
    double local[2] = {ex_max_abs_diff(model.params, ref_mine, model.nparams), elapsed}, worst[2];
    EX_NCCL(comm, ncclGroupStart());
    EX_NCCL(comm, ncclBroadcast(&loss, &loss, 1, ncclDouble, last_rank, comm, NULL));
    EX_NCCL(comm, ncclAllReduce(&same, &all_same, 1, ncclInt32, ncclMin, comm, NULL));
    EX_NCCL(comm, ncclAllReduce(local, worst, 2, ncclDouble, ncclMax, comm, NULL));
    EX_NCCL(comm, ncclGroupEnd());
    int loss_same = memcmp(&loss, &ref_loss, sizeof loss) == 0;
    ok = ok && all_same && loss_same;
    if (step > 0 || o->steps == 1) {
      busy_sum += busy;
      step_sum += worst[1];
    }
    if (rank == 0) {
      char wdesc[64];
      if (all_same)
        snprintf(wdesc, sizeof wdesc, "bit-identical");
      else
        snprintf(wdesc, sizeof wdesc, "DIFFERENT (max %.2e)", worst[0]);
      printf("%4d  %10.6f  %10.6f  %-13s  %-28s  %8.2f\n", step, loss, ref_loss,
             loss_same ? "identical" : "DIFFERENT", wdesc, 1e3 * worst[1]);
    }
  }

  /* How busy each rank was: with the whole batch in flight, rank r waits
   * while the others compute, which is what pipelining recovers. */
  int timed = o->steps > 1 ? o->steps - 1 : 1;
  double mine = busy_sum / timed;
  double *all = malloc((size_t)nranks * sizeof(double));
  if (!all) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    return 1;
  }
  EX_NCCL(comm, ncclAllGather(&mine, all, 1, ncclDouble, comm, NULL));
  if (rank == 0) {
    double step_ms = 1e3 * step_sum / timed;
    printf("time per step (slowest rank, mean of %d step%s%s): %.2f ms; compute per rank:", timed,
           timed == 1 ? "" : "s", o->steps > 1 ? " after the first" : "", step_ms);
    for (int r = 0; r < nranks; r++)
      printf(" %d: %.2f ms (%.0f%%)", r, 1e3 * all[r], 100.0 * 1e3 * all[r] / step_ms);
    printf("\n");
    if (ok)
      printf("model_parallel: AGREE: loss and the weights of all %d ranks bit-identical to the single-process "
             "run at every step\n", nranks);
    else
      printf("model_parallel: MISMATCH: see the steps marked DIFFERENT above\n");
  }
  free(all);
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
  mp_opts o = {.ranks = 2, .steps = 8, .batch = 64, .in = 32, .hidden = 256, .layers = 0, .classes = 10,
               .seed = 1, .timeout = 60, .lr = 0.05};
  const ex_opt opts[] = {
      {"ranks", EX_OPT_INT, &o.ranks, "number of ranks (processes) to start"},
      {"steps", EX_OPT_INT, &o.steps, "training steps"},
      {"batch", EX_OPT_INT, &o.batch, "rows per step"},
      {"in", EX_OPT_INT, &o.in, "input features"},
      {"hidden", EX_OPT_INT, &o.hidden, "width of the hidden layers"},
      {"layers", EX_OPT_INT, &o.layers, "dense layers, at least --ranks (0: two per rank)"},
      {"classes", EX_OPT_INT, &o.classes, "output classes"},
      {"lr", EX_OPT_DOUBLE, &o.lr, "SGD learning rate"},
      {"seed", EX_OPT_INT, &o.seed, "seed of the weights and the data"},
      {"timeout", EX_OPT_INT, &o.timeout, "seconds each rank may run"},
      {NULL, 0, NULL, NULL}};
  ex_parse_args(argc, argv, "Model (layer) parallel training of a small MLP on host communicators.", opts);
  if (o.layers == 0)
    o.layers = 2 * o.ranks;
  if (o.ranks < 1 || o.steps < 1 || o.batch < 1 || o.layers < o.ranks || o.layers > 128 || o.in < 1 ||
      o.hidden < 1 || o.classes < 2 || o.timeout < 1) {
    fprintf(stderr, "%s: need ranks >= 1, steps >= 1, batch >= 1, ranks <= layers <= 128, classes >= 2, "
                    "timeout >= 1\n", argv[0]);
    return 2;
  }
  setenv("LOOM_DEVICE", "host", 1);
  return ex_run_ranks("model_parallel", o.ranks, (unsigned)o.timeout, rank_main, &o);
}
