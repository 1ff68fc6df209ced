/*
 * What every module of the library includes: the public API, error
 * propagation, logging and parameters.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_CORE_H
#define LOOM_CORE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "misc/debug.h"
#include "misc/errors.h"
#include "misc/param.h"

/* Propagates a failure; the place that detected it already recorded the
 * sentence (err_set), so nothing is logged here. */
#define CHECK(call)                      \
  do {                                   \
    ncclResult_t check_res_ = (call);    \
    if (check_res_ != ncclSuccess)       \
      return check_res_;                 \
  } while (0)

#define CHECK_GOTO(call, res, label)     \
  do {                                   \
    (res) = (call);                      \
    if ((res) != ncclSuccess)            \
      goto label;                        \
  } while (0)

/* Functions the GPU kernels call too (CUDA's nvcc, HIP's clang); plain C
 * functions elsewhere. */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

#define LOOM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LOOM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define LOOM_DIV_UP(a, b) (((a) + (b) - 1) / (b))
#define LOOM_ALIGN_UP(a, b) (LOOM_DIV_UP(a, b) * (b))

/* Thread-local words read on every call: the initial-exec model reads
 * them without a __tls_get_addr call. They are few and small, so they fit
 * the static TLS that glibc keeps for libraries loaded with dlopen; but
 * one initial-exec variable puts the library's whole TLS block there, and
 * with the CUDA runtime linked in that block is 12 KB and page-aligned,
 * which no surplus holds: CUDA builds use the dynamic model, so that
 * Python (ctypes) or a framework can still dlopen libnccl.so.2. */
#if LOOM_HAVE_CUDA
#define LOOM_TLS_FAST __thread
#else
#define LOOM_TLS_FAST __thread __attribute__((tls_model("initial-exec")))
#endif

/* Every FIFO has this many slots, as in NCCL. */
#define NCCL_STEPS 8
#define LOOM_MAX_CHANNELS 32
#define LOOM_CACHE_LINE 128

#endif
