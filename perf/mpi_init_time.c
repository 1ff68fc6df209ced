/*
 * mpi_init_time: MPI_Init's time on each process, for bootstrap_scale.py
 * to set beside Loom's ncclCommInitRank. Prints one line from rank 0:
 * n, the slowest and the median process's MPI_Init, and the wall time
 * from the first process entering MPI_Init to the last leaving it.
 * SPDX-License-Identifier: Apache-2.0
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  double t[2];
  t[0] = mono_s();
  MPI_Init(&argc, &argv);
  t[1] = mono_s();
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  double *all = rank == 0 ? malloc(sizeof(double) * 2 * (size_t)n) : NULL;
  MPI_Gather(t, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    double *d = malloc(sizeof(double) * (size_t)n), first = all[0], last = all[1];
    for (int i = 0; i < n; i++) {
      d[i] = all[2 * i + 1] - all[2 * i];
      first = all[2 * i] < first ? all[2 * i] : first;
      last = all[2 * i + 1] > last ? all[2 * i + 1] : last;
    }
    qsort(d, (size_t)n, sizeof *d, cmp_double);
    printf("n=%d mpi_init_max_s=%.4f mpi_init_med_s=%.4f mpi_wall_s=%.4f\n", n, d[n - 1], d[n / 2], last - first);
    free(d);
    free(all);
  }
  MPI_Finalize();
  return 0;
}
