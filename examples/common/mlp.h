/*
 * A tiny multi-layer perceptron in plain C, shared by the examples: dense
 * layers with ReLU between them, softmax cross-entropy on the last one,
 * forward, backward and SGD, all single-threaded and deterministic, so that
 * a distributed run can be compared with a single-process one computed by
 * the very same functions.
 *
 * Layers are created by their index in the whole model and initialised
 * from (seed, index) alone. A rank that holds only layers 4..7 of a
 * pipeline therefore has exactly the weights a single process holding all
 * of them would have, which is what lets model and pipeline parallel runs
 * be checked bit for bit.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef EX_MLP_H
#define EX_MLP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y = x W + b over `rows` rows, then ReLU unless it is the model's last
 * layer. W is stored in x out (row i holds the weights from input i), so
 * that the inner loops of forward and weight gradient run over contiguous
 * outputs and the compiler vectorises them without reassociating sums. */
typedef struct {
  int in, out;
  int relu;
  float *w, *b;     /* point into the owning mlp's params */
  float *gw, *gb;   /* point into the owning mlp's grads */
} ex_dense;

/* A run of consecutive layers [first, first + nlayers) of a model whose
 * widths are dims[0..total]. Parameters and gradients are each one
 * contiguous array, so one collective call moves all of them. */
typedef struct {
  int first, nlayers;
  ex_dense *layers;
  float *params, *grads;
  size_t nparams;
} ex_mlp;

/* Activations (and their gradients) of one ex_mlp for up to `capacity`
 * rows: act[k] is the input of layer first + k, act[nlayers] the output of
 * the last; row n of act[k] starts at act[k] + n * width. A caller copies
 * its data into act[0], or has a peer send straight into it. */
typedef struct {
  int nlayers, capacity;
  int *width;       /* width[k]: the width of act[k] and grad[k] */
  float **act, **grad;
} ex_acts;

/* A deterministic stream of random numbers (splitmix64). */
typedef struct { uint64_t state; } ex_rng;
void ex_rng_seed(ex_rng *r, uint64_t seed, uint64_t stream);
uint64_t ex_rng_next(ex_rng *r);
float ex_rng_uniform(ex_rng *r, float lo, float hi);

/* Returns 0, or -1 when out of memory. dims has total + 1 entries. */
int ex_mlp_init(ex_mlp *m, const int *dims, int total, int first, int nlayers, uint64_t seed);
void ex_mlp_free(ex_mlp *m);
void ex_mlp_zero_grad(ex_mlp *m);
void ex_mlp_sgd(ex_mlp *m, float lr);

int ex_acts_init(ex_acts *a, const ex_mlp *m, int capacity);
void ex_acts_free(ex_acts *a);

void ex_dense_forward(const ex_dense *l, int rows, const float *x, float *y);
/* dy is the gradient of the layer's output y; it is masked by ReLU in
 * place. Adds to gw and gb; writes dx unless it is NULL. */
void ex_dense_backward(ex_dense *l, int rows, const float *x, const float *y,
                       float *dy, float *dx);

/* Forward or backward through all layers of m for rows [row0, row0+rows)
 * of the activations. Backward expects a->grad[nlayers] filled and writes
 * a->grad[0] when want_dx is set (a pipeline stage sends it upstream; the
 * first layer of the whole model has no use for it). */
void ex_mlp_forward(const ex_mlp *m, ex_acts *a, int row0, int rows);
void ex_mlp_backward(ex_mlp *m, ex_acts *a, int row0, int rows, int want_dx);

/* Softmax cross-entropy of `rows` rows of logits against labels. Returns
 * the sum of the per-row losses and writes dlogits = scale * (p - onehot):
 * scale is 1 / (the number of rows the loss is averaged over). */
double ex_softmax_xent(const float *logits, const int *labels, int rows, int classes,
                       float scale, float *dlogits);

/* A synthetic classification batch for one step: inputs uniform in [-1, 1]
 * and the label a fixed random linear "teacher" picks, so the loss can
 * actually fall. The same (seed, step) gives the same batch everywhere. */
void ex_make_batch(uint64_t seed, int step, int rows, int in, int classes,
                   float *x, int *labels);

/* FNV-1a over the bytes of n floats: equal hashes on every rank mean
 * bit-identical weights (with overwhelming probability). */
uint64_t ex_hash_floats(const float *v, size_t n);
/* The largest |a - b| over n floats. */
double ex_max_abs_diff(const float *a, const float *b, size_t n);

#ifdef __cplusplus
}
#endif

#endif
