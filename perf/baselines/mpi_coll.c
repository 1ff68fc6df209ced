/*
 * The Open MPI side of perf/compare_host.sh: AllReduce (float sum),
 * AllGather and ReduceScatter timed the way Loom's *_perf tools time them
 * (each timed call a buffer further into the MAX bytes allocated) and
 * sized as they size them, so that the two columns can be divided.
 * Size is the largest buffer of the call, as in nccl-tests: AllReduce's
 * buffer, AllGather's output, ReduceScatter's input; a rank holds size/n
 * of the gathered or scattered side, and the size is rounded down to whole
 * floats per rank (sizes that leave none are skipped).
 *
 *   mpi_coll allreduce|allgather|reducescatter MIN MAX FACTOR WARMUP ITERS
 *
 * prints one line per size, "coll size time_us algbw_GBs busbw_GBs", time
 * being the slowest rank's mean over ITERS out-of-place calls.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { ALLREDUCE, ALLGATHER, REDUCESCATTER };

static void run(enum coll c, const float *in, float *out, size_t count, int n) {
  int per = (int)(count / (size_t)n);
  if (c == ALLREDUCE)
    MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (c == ALLGATHER)
    MPI_Allgather(in, per, MPI_FLOAT, out, per, MPI_FLOAT, MPI_COMM_WORLD);
  else
    MPI_Reduce_scatter_block(in, out, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

/* Checked once per size, outside the timing: a wrong baseline would make
 * the ratios lie. Every rank's input holds rank + 1. */
static int wrong(enum coll c, const float *out, size_t count, int n) {
  size_t per = count / (size_t)n;
  float sum = (float)(n * (n + 1) / 2);
  size_t m = c == REDUCESCATTER ? per : count;
  for (size_t i = 0; i < m; i++) {
    float want = c == ALLGATHER ? (float)(i / per + 1) : sum;
    if (out[i] != want)
      return 1;
  }
  return 0;
}

static int usage(int rank, const char *msg) {
  if (rank == 0)
    fprintf(stderr, "mpi_coll: %s\nusage: mpi_coll allreduce|allgather|reducescatter MIN MAX FACTOR WARMUP ITERS\n",
            msg);
  MPI_Finalize();
  return 2;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 7)
    return usage(rank, "wrong number of arguments");
  enum coll c;
  if (strcmp(argv[1], "allreduce") == 0)
    c = ALLREDUCE;
  else if (strcmp(argv[1], "allgather") == 0)
    c = ALLGATHER;
  else if (strcmp(argv[1], "reducescatter") == 0)
    c = REDUCESCATTER;
  else
    return usage(rank, "unknown collective");
  size_t min = strtoull(argv[2], NULL, 10), max = strtoull(argv[3], NULL, 10);
  long factor = atol(argv[4]);
  int warmup = atoi(argv[5]), iters = atoi(argv[6]);
  if (factor < 2 || warmup < 0 || iters < 1 || min < 1 || max < min || max / sizeof(float) > 0x7fffffff)
    return usage(rank, "need FACTOR >= 2, WARMUP >= 0, ITERS >= 1, 1 <= MIN <= MAX < 8 GiB");

  /* Room for the connection warm-up below, which may exceed MAX. */
  size_t cap = max / sizeof(float) + (size_t)n;
  float *in = malloc(cap * sizeof(float)), *out = malloc(cap * sizeof(float));
  if (!in || !out) {
    fprintf(stderr, "mpi_coll: rank %d cannot allocate 2 x %zu bytes\n", rank, cap * sizeof(float));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Touched before timing, as Loom's tools do, so page faults stay out. */
  for (size_t i = 0; i < cap; i++) {
    in[i] = (float)(rank + 1);
    out[i] = 0;
  }
  double busf = c == ALLREDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
  /* Open MPI connects its peers on first use, which belongs to no size;
   * Loom's tools connect when they create the communicator, before timing. */
  for (int i = 0; i < 5; i++)
    run(c, in, out, (size_t)n, n);

  for (size_t size = min; size <= max; size *= (size_t)factor) {
    size_t count = size / sizeof(float);
    if (c != ALLREDUCE)
      count -= count % (size_t)n;
    if (count == 0)
      continue;
    for (int i = 0; i < warmup; i++)
      run(c, in, out, count, n);
    /* Call i works on the buffers `count` floats times i (mod steps) in,
     * as Loom's tools and nccl-tests do, so that a size smaller than MAX
     * is not always served from the same cache lines: without it the
     * sweep's middle sizes ran warm here and cold in Loom's column. */
    size_t steps = (max / sizeof(float)) / count, last = 0;
    if (steps == 0)
      steps = 1;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
      last = count * ((size_t)i % steps);
      run(c, in + last, out + last, count, n);
    }
    double mean = (MPI_Wtime() - t0) / iters, slowest;
    MPI_Allreduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (wrong(c, out + last, count, n)) {
      fprintf(stderr, "mpi_coll: rank %d: wrong %s result at %zu bytes\n", rank, argv[1], count * sizeof(float));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double bytes = (double)(count * sizeof(float)), algbw = bytes / slowest / 1e9;
    if (rank == 0) {
      printf("%s %zu %.2f %.3f %.3f\n", argv[1], count * sizeof(float), slowest * 1e6, algbw, algbw * busf);
      fflush(stdout);
    }
    if (size > max / (size_t)factor)
      break;
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
