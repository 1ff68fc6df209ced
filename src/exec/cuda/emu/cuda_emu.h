/*
 * The kernel shim of the CUDA emulation: what kernel.cu needs of CUDA C,
 * as host C++, so that the kernel's own source runs on the CPU
 * (kernel_emu.cpp includes this, then kernel.cu). __shared__ becomes
 * `static thread_local`, which is per block because a block is one OS
 * thread (emu_grid.cpp); threadIdx and friends are the running fiber's.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_CUDA_EMU_H
#define LOOM_CUDA_EMU_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#include "exec/cuda/emu/emu.h" /* struct emu_thread; emu_bar_sync, emu_bar_arrive, emu_yield */

/* The running CUDA thread (emu_grid.cpp). */
extern thread_local struct emu_thread *emu_self;
/* bar.sync 0 with every thread of the block (emu_bar_sync). */
void emu_syncthreads(void);

/* emu_self is the block's OS thread's, and each of its CUDA threads
 * stores its own there when it resumes: the accesses are atomic (relaxed),
 * so that ThreadSanitizer, which sees the fibers as threads, sees no race
 * on the grid runner's own bookkeeping. */
static inline struct emu_thread *emu_cur(void) { return __atomic_load_n(&emu_self, __ATOMIC_RELAXED); }

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __shared__
#define __shared__ static thread_local
#undef __launch_bounds__
#define __launch_bounds__(n)
#define threadIdx (emu_cur()->tid)
#define blockIdx (emu_cur()->bid)
#define blockDim (emu_cur()->bdim)
#define gridDim (emu_cur()->gdim)
#define __syncthreads() emu_syncthreads()
#define __threadfence_system() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* Built with -ffp-contract=off, so that each is one rounded operation as
 * on the GPU. */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }

static inline int atomicCAS(int *p, int expected, int desired) {
  __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}

/* The PTX acquire load and release store of kernel.cu. A waiting block
 * spins here: it yields, so that on two cores the block it waits for runs. */
static inline uint64_t emu_load_acquire(const uint64_t *p) {
  uint64_t v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
  sched_yield();
  return v;
}
static inline void emu_store_release(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* The words a host thread reads or writes while the kernel runs (struct
 * dev_status in mapped host memory). On the GPU they are volatile, which
 * is what makes each access reach memory; in C++ two threads' accesses to
 * one object of which one writes are a data race unless both are atomic,
 * and ThreadSanitizer says so. kernel.cu makes these accesses through
 * them when emulated: relaxed where only the value matters (the abort
 * flag, the progress count), release where the store publishes what the
 * thread wrote before it (the error after the fields that describe it;
 * the host reads it with an acquire load). */
template <typename T> static inline T emu_volatile_load(const volatile T *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
template <typename T> static inline void emu_volatile_store(volatile T *p, T v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline void emu_volatile_publish(volatile T *p, T v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* The LL protocol's 16-byte line (kernel_ll.cuh): on the GPU one 16-byte
 * volatile store and load. An x86 16-byte store is not guaranteed atomic,
 * so here each 8-byte half {data32, flag32} is a relaxed atomic of its
 * own and its flag is checked on its own, which is all the line's
 * layout needs (and ThreadSanitizer sees no race). A poll that fails
 * yields, so that on two cores the writer runs. */
static inline bool emu_ll_load(const char *line, uint32_t flag, uint64_t *v) {
  const uint64_t *q = (const uint64_t *)line;
  uint64_t lo = __atomic_load_n(q, __ATOMIC_RELAXED), hi = __atomic_load_n(q + 1, __ATOMIC_RELAXED);
  *v = (lo & 0xffffffffull) | hi << 32;
  if ((uint32_t)(lo >> 32) == flag && (uint32_t)(hi >> 32) == flag)
    return true;
  sched_yield();
  return false;
}
static inline void emu_ll_store(char *line, uint64_t v, uint32_t flag) {
  uint64_t *q = (uint64_t *)line;
  __atomic_store_n(q, (v & 0xffffffffull) | (uint64_t)flag << 32, __ATOMIC_RELAXED);
  __atomic_store_n(q + 1, (v >> 32) | (uint64_t)flag << 32, __ATOMIC_RELAXED);
}

#endif
