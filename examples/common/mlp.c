/*
 * The examples' MLP (mlp.h). Every loop keeps one fixed order of floating
 * point operations that does not depend on how many rows a call gets: a
 * weight gradient accumulates row after row, so running a batch as several
 * consecutive micro-batches adds the same terms in the same order as one
 * call over the whole batch.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "mlp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ex_rng_seed(ex_rng *r, uint64_t seed, uint64_t stream)
{
  /* Mixing the stream in through one step of the generator keeps nearby
   * seeds and streams from producing overlapping sequences. */
  r->state = seed ^ (stream * 0xd1b54a32d192ed03ull);
  (void)ex_rng_next(r);
}

uint64_t ex_rng_next(ex_rng *r)
{
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float ex_rng_uniform(ex_rng *r, float lo, float hi)
{
  /* 24 random bits: exactly representable in a float, so the value does
   * not depend on the rounding mode or the compiler. */
  float u = (float)(ex_rng_next(r) >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

int ex_mlp_init(ex_mlp *m, const int *dims, int total, int first, int nlayers, uint64_t seed)
{
  memset(m, 0, sizeof(*m));
  m->first = first;
  m->nlayers = nlayers;
  for (int k = 0; k < nlayers; k++)
    m->nparams += (size_t)dims[first + k] * dims[first + k + 1] + dims[first + k + 1];
  m->layers = calloc((size_t)nlayers, sizeof(*m->layers));
  m->params = calloc(m->nparams ? m->nparams : 1, sizeof(float));
  m->grads = calloc(m->nparams ? m->nparams : 1, sizeof(float));
  if (!m->layers || !m->params || !m->grads) {
    ex_mlp_free(m);
    return -1;
  }
  size_t off = 0;
  for (int k = 0; k < nlayers; k++) {
    ex_dense *l = &m->layers[k];
    int index = first + k;
    l->in = dims[index];
    l->out = dims[index + 1];
    l->relu = index != total - 1;
    l->w = m->params + off;
    l->gw = m->grads + off;
    off += (size_t)l->in * l->out;
    l->b = m->params + off;
    l->gb = m->grads + off;
    off += (size_t)l->out;
    /* He-uniform weights from the layer's own stream, zero biases: the
     * layer is the same whichever rank creates it. */
    ex_rng r;
    ex_rng_seed(&r, seed, (uint64_t)index + 1);
    float a = sqrtf(6.0f / (float)l->in);
    for (size_t j = 0; j < (size_t)l->in * l->out; j++)
      l->w[j] = ex_rng_uniform(&r, -a, a);
  }
  return 0;
}

void ex_mlp_free(ex_mlp *m)
{
  free(m->layers);
  free(m->params);
  free(m->grads);
  memset(m, 0, sizeof(*m));
}

void ex_mlp_zero_grad(ex_mlp *m)
{
  memset(m->grads, 0, m->nparams * sizeof(float));
}

void ex_mlp_sgd(ex_mlp *m, float lr)
{
  for (size_t j = 0; j < m->nparams; j++)
    m->params[j] -= lr * m->grads[j];
}

int ex_acts_init(ex_acts *a, const ex_mlp *m, int capacity)
{
  memset(a, 0, sizeof(*a));
  a->nlayers = m->nlayers;
  a->capacity = capacity;
  a->width = calloc((size_t)m->nlayers + 1, sizeof(*a->width));
  a->act = calloc((size_t)m->nlayers + 1, sizeof(*a->act));
  a->grad = calloc((size_t)m->nlayers + 1, sizeof(*a->grad));
  if (!a->width || !a->act || !a->grad) {
    ex_acts_free(a);
    return -1;
  }
  for (int k = 0; k <= m->nlayers; k++) {
    a->width[k] = k < m->nlayers ? m->layers[k].in : m->layers[k - 1].out;
    a->act[k] = calloc((size_t)capacity * a->width[k], sizeof(float));
    a->grad[k] = calloc((size_t)capacity * a->width[k], sizeof(float));
    if (!a->act[k] || !a->grad[k]) {
      ex_acts_free(a);
      return -1;
    }
  }
  return 0;
}

void ex_acts_free(ex_acts *a)
{
  for (int k = 0; a->act && k <= a->nlayers; k++) {
    free(a->act[k]);
    free(a->grad[k]);
  }
  free(a->act);
  free(a->grad);
  free(a->width);
  memset(a, 0, sizeof(*a));
}

void ex_dense_forward(const ex_dense *l, int rows, const float *x, float *y)
{
  for (int n = 0; n < rows; n++) {
    const float *xn = x + (size_t)n * l->in;
    float *yn = y + (size_t)n * l->out;
    memcpy(yn, l->b, (size_t)l->out * sizeof(float));
    for (int i = 0; i < l->in; i++) {
      const float xv = xn[i];
      const float *wi = l->w + (size_t)i * l->out;
      for (int o = 0; o < l->out; o++)
        yn[o] += xv * wi[o];
    }
    if (l->relu)
      for (int o = 0; o < l->out; o++)
        yn[o] = yn[o] > 0.0f ? yn[o] : 0.0f;
  }
}

/* Eight partial sums so that the compiler may vectorise the dot product
 * without -ffast-math; the order is fixed, so the result is too. */
static float dot(const float *a, const float *b, int n)
{
  float acc[8] = {0};
  int k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; j++)
      acc[j] += a[k + j] * b[k + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; k < n; k++)
    s += a[k] * b[k];
  return s;
}

void ex_dense_backward(ex_dense *l, int rows, const float *x, const float *y,
                       float *dy, float *dx)
{
  for (int n = 0; n < rows; n++) {
    const float *xn = x + (size_t)n * l->in;
    const float *yn = y + (size_t)n * l->out;
    float *dyn = dy + (size_t)n * l->out;
    if (l->relu)
      for (int o = 0; o < l->out; o++)
        dyn[o] = yn[o] > 0.0f ? dyn[o] : 0.0f;
    for (int o = 0; o < l->out; o++)
      l->gb[o] += dyn[o];
    for (int i = 0; i < l->in; i++) {
      const float xv = xn[i];
      float *gwi = l->gw + (size_t)i * l->out;
      for (int o = 0; o < l->out; o++)
        gwi[o] += xv * dyn[o];
    }
    if (dx) {
      float *dxn = dx + (size_t)n * l->in;
      for (int i = 0; i < l->in; i++)
        dxn[i] = dot(l->w + (size_t)i * l->out, dyn, l->out);
    }
  }
}

void ex_mlp_forward(const ex_mlp *m, ex_acts *a, int row0, int rows)
{
  for (int k = 0; k < m->nlayers; k++)
    ex_dense_forward(&m->layers[k], rows, a->act[k] + (size_t)row0 * a->width[k],
                     a->act[k + 1] + (size_t)row0 * a->width[k + 1]);
}

void ex_mlp_backward(ex_mlp *m, ex_acts *a, int row0, int rows, int want_dx)
{
  for (int k = m->nlayers - 1; k >= 0; k--) {
    float *dx = (k > 0 || want_dx) ? a->grad[k] + (size_t)row0 * a->width[k] : NULL;
    ex_dense_backward(&m->layers[k], rows, a->act[k] + (size_t)row0 * a->width[k],
                      a->act[k + 1] + (size_t)row0 * a->width[k + 1],
                      a->grad[k + 1] + (size_t)row0 * a->width[k + 1], dx);
  }
}

double ex_softmax_xent(const float *logits, const int *labels, int rows, int classes,
                       float scale, float *dlogits)
{
  double loss = 0.0;
  for (int n = 0; n < rows; n++) {
    const float *z = logits + (size_t)n * classes;
    float *dz = dlogits + (size_t)n * classes;
    float zmax = z[0];
    for (int c = 1; c < classes; c++)
      zmax = z[c] > zmax ? z[c] : zmax;
    float sum = 0.0f;
    for (int c = 0; c < classes; c++) {
      dz[c] = expf(z[c] - zmax);
      sum += dz[c];
    }
    for (int c = 0; c < classes; c++)
      dz[c] = scale * (dz[c] / sum - (c == labels[n] ? 1.0f : 0.0f));
    loss += (double)logf(sum) - (double)(z[labels[n]] - zmax);
  }
  return loss;
}

void ex_make_batch(uint64_t seed, int step, int rows, int in, int classes,
                   float *x, int *labels)
{
  ex_rng r;
  ex_rng_seed(&r, seed, 0x100000000ull + (uint64_t)step);
  for (size_t j = 0; j < (size_t)rows * in; j++)
    x[j] = ex_rng_uniform(&r, -1.0f, 1.0f);
  /* The teacher is drawn afresh for every batch from its own fixed stream,
   * which costs in x classes numbers and keeps the function stateless. */
  ex_rng t;
  ex_rng_seed(&t, seed, 0xffffffffull);
  float *teacher = malloc((size_t)in * classes * sizeof(float));
  if (!teacher) {
    for (int n = 0; n < rows; n++)
      labels[n] = n % classes;
    return;
  }
  for (size_t j = 0; j < (size_t)in * classes; j++)
    teacher[j] = ex_rng_uniform(&t, -1.0f, 1.0f);
  for (int n = 0; n < rows; n++) {
    int best = 0;
    float best_score = 0.0f;
    for (int c = 0; c < classes; c++) {
      float s = 0.0f;
      for (int i = 0; i < in; i++)
        s += x[(size_t)n * in + i] * teacher[(size_t)i * classes + c];
      if (c == 0 || s > best_score) {
        best = c;
        best_score = s;
      }
    }
    labels[n] = best;
  }
  free(teacher);
}

uint64_t ex_hash_floats(const float *v, size_t n)
{
  const unsigned char *p = (const unsigned char *)v;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t j = 0; j < n * sizeof(float); j++) {
    h ^= p[j];
    h *= 0x100000001b3ull;
  }
  return h;
}

double ex_max_abs_diff(const float *a, const float *b, size_t n)
{
  double worst = 0.0;
  for (size_t j = 0; j < n; j++) {
    double d = fabs((double)a[j] - (double)b[j]);
    if (d > worst || d != d)
      worst = d;
  }
  return worst;
}
