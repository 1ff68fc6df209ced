/*
 * memcpy bandwidth on buffers far beyond the caches: the unit in which
 * perf/compare_host.sh states the machine's limit for a 2-rank AllReduce.
 *
 *   memcpy_bw [MiB [REPS [THREADS]]]        (defaults 256 7 1)
 *
 * Each of THREADS threads copies its own MiB buffer REPS times, all
 * threads starting each copy together, so that THREADS = 2 shows what one
 * copy gets while another runs, as two ranks' copies do. Prints
 *   memcpy THREADS MiB REPS median_GBs best_GBs
 * per thread and per copy (bytes copied per second; reading and writing
 * them is twice that in memory traffic).
 * SPDX-License-Identifier: Apache-2.0
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_THREADS 64
#define MAX_REPS 101

struct worker {
  size_t bytes;
  int reps;
  char *a, *b;
  double gbs[MAX_REPS];
  pthread_t tid;
};

static pthread_barrier_t start;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *work(void *arg) {
  struct worker *w = arg;
  /* First touch from the copying thread, so that its pages are local to it
   * and no page fault lands inside a timed copy. */
  memset(w->a, 1, w->bytes);
  memset(w->b, 2, w->bytes);
  for (int i = 0; i < w->reps; i++) {
    pthread_barrier_wait(&start);
    double t0 = now();
    /* Alternating directions: a copy never finds its destination cached
     * from being the previous copy's source. */
    memcpy(i % 2 ? w->a : w->b, i % 2 ? w->b : w->a, w->bytes);
    w->gbs[i] = (double)w->bytes / (now() - t0) / 1e9;
  }
  return NULL;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

int main(int argc, char **argv) {
  long mib = argc > 1 ? atol(argv[1]) : 256;
  int reps = argc > 2 ? atoi(argv[2]) : 7, nthreads = argc > 3 ? atoi(argv[3]) : 1;
  if (argc > 4 || mib < 1 || reps < 1 || reps > MAX_REPS || nthreads < 1 || nthreads > MAX_THREADS) {
    fprintf(stderr, "usage: memcpy_bw [MiB [REPS (1-%d) [THREADS (1-%d)]]]\n", MAX_REPS, MAX_THREADS);
    return 2;
  }
  static struct worker w[MAX_THREADS];
  pthread_barrier_init(&start, NULL, (unsigned)nthreads);
  for (int t = 0; t < nthreads; t++) {
    w[t].bytes = (size_t)mib << 20;
    w[t].reps = reps;
    w[t].a = malloc(w[t].bytes);
    w[t].b = malloc(w[t].bytes);
    if (!w[t].a || !w[t].b) {
      fprintf(stderr, "memcpy_bw: cannot allocate 2 x %ld MiB per thread for %d threads\n", mib, nthreads);
      return 1;
    }
  }
  for (int t = 0; t < nthreads; t++)
    if (pthread_create(&w[t].tid, NULL, work, &w[t]) != 0) {
      fprintf(stderr, "memcpy_bw: cannot start thread %d\n", t);
      return 1;
    }
  static double all[MAX_THREADS * MAX_REPS];
  int k = 0;
  long check = 0;
  for (int t = 0; t < nthreads; t++) {
    pthread_join(w[t].tid, NULL);
    for (int i = 0; i < reps; i++)
      all[k++] = w[t].gbs[i];
    /* Reading the copies back keeps the compiler from dropping them. */
    check += w[t].a[w[t].bytes / 2] + w[t].b[w[t].bytes / 3];
  }
  qsort(all, (size_t)k, sizeof all[0], cmp_double);
  double median = k % 2 ? all[k / 2] : (all[k / 2 - 1] + all[k / 2]) / 2;
  printf("memcpy %d %ld %d %.3f %.3f\n", nthreads, mib, reps, median, all[k - 1]);
  if (check != 2L * nthreads) {
    fprintf(stderr, "memcpy_bw: the buffers do not hold what was copied\n");
    return 1;
  }
  for (int t = 0; t < nthreads; t++) {
    free(w[t].a);
    free(w[t].b);
  }
  pthread_barrier_destroy(&start);
  return 0;
}
