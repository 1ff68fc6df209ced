/*
 * reduce_kernel_bw: the CUDA executor's reduction loop against the device's
 * own copy, in one run. It times dst = a + b (float32 Sum) over a buffer
 * and cudaMemcpy device to device of the same buffer, and prints the bytes
 * each moves per second (reduce: reads 2, writes 1; copy: reads 1, writes 1)
 * and their ratio. Usage: reduce_kernel_bw [MiB, default 256] [iterations]
 * Exits 77 where there is no CUDA device.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "misc/gpurt.h"
#include <stdio.h>
#include <stdlib.h>

#include "exec/cuda/dev.h"

#define TRY(call)                                                                    \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                    \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
  int iters = argc > 2 ? atoi(argv[2]) : 20;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no CUDA device\n");
    return 77;
  }
  size_t bytes = mib << 20, count = bytes / sizeof(float);
  float *a, *b, *c;
  TRY(cudaMalloc((void **)&a, bytes));
  TRY(cudaMalloc((void **)&b, bytes));
  TRY(cudaMalloc((void **)&c, bytes));
  TRY(cudaMemset(a, 0, bytes));
  TRY(cudaMemset(b, 0, bytes));
  cudaEvent_t t0, t1;
  TRY(cudaEventCreate(&t0));
  TRY(cudaEventCreate(&t1));
  struct red_op op = {.dtype = ncclFloat32, .kind = RED_SUM};
  float ms_red = 0, ms_copy = 0;
  for (int pass = 0; pass < 2; pass++) { /* the first is a warm-up */
    TRY(cudaEventRecord(t0, 0));
    for (int i = 0; i < iters; i++)
      TRY((cudaError_t)cuda_bench_reduce(&op, c, a, b, count, NULL));
    TRY(cudaEventRecord(t1, 0));
    TRY(cudaEventSynchronize(t1));
    TRY(cudaEventElapsedTime(&ms_red, t0, t1));
    TRY(cudaEventRecord(t0, 0));
    for (int i = 0; i < iters; i++)
      TRY(cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, 0));
    TRY(cudaEventRecord(t1, 0));
    TRY(cudaEventSynchronize(t1));
    TRY(cudaEventElapsedTime(&ms_copy, t0, t1));
  }
  double red = 3.0 * bytes * iters / (ms_red * 1e-3) / 1e9, copy = 2.0 * bytes * iters / (ms_copy * 1e-3) / 1e9;
  printf("buffer %zu MiB, %d iterations\n", mib, iters);
  printf("reduce kernel (float32 sum, 2 reads + 1 write): %8.1f GB/s\n", red);
  printf("cudaMemcpy device to device (1 read + 1 write): %8.1f GB/s\n", copy);
  printf("reduce / copy: %.1f%%\n", 100.0 * red / copy);
  return 0;
}
