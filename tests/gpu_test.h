/*
 * What the GPU tests share (test_gpu.c, test_gpu_order.c): skipping where
 * no device is (harness_cuda_devices asks in a child, since CUDA started
 * here would not work in the forked ranks), a CUDA call that must
 * succeed, and the stand-in of a test in a build without CUDA.
 */
#ifndef LOOM_GPU_TEST_H
#define LOOM_GPU_TEST_H

#include "harness.h"
#include "test.h"

#define NO_CUDA(name) \
  TEST_IMPL(name) { SKIP("no CUDA device (this build has no CUDA toolkit)"); }

#if LOOM_TEST_CUDA
#include "misc/gpurt.h" /* CUDA's runtime, or HIP's by CUDA's names */

#define NEED_GPU()                          \
  do {                                      \
    if (harness_cuda_devices() == 0)        \
      SKIP("no " GPURT_NAME " device");     \
  } while (0)

#define CUDA_OK(call)                                                                     \
  do {                                                                                    \
    cudaError_t cuda_ok_e_ = (call);                                                      \
    RASSERT(cuda_ok_e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cuda_ok_e_)); \
  } while (0)
#endif

#endif
