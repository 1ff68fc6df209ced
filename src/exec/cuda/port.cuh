/*
 * The kernel's one source on three targets: NVIDIA GPUs (nvcc), AMD GPUs
 * (hipcc, HIP on clang) and the CPU emulation (the host compiler, with
 * emu/cuda_emu.h included before kernel.cu). Everything the three do
 * differently is here, one operation at a time; kernel.cu,
 * kernel_simple.cuh and kernel_ll.cuh call these and nothing
 * target-specific.
 *
 * What AMD lacks, and what it gets instead:
 * - PTX (acquire loads, release stores, global-space vector loads, the
 *   global timer): clang's atomics with HIP's system scope, plain loads,
 *   the constant-rate s_memrealtime counter.
 * - Named barriers (bar.sync / bar.arrive with a thread count): none on
 *   gfx90a or gfx942, so Simple works take the serial loop, every thread
 *   meeting at __syncthreads (PORT_NAMED_BARRIERS 0).
 * - fp8 and bf16 conversions (HIP 5.2 has neither as intrinsics) and the
 *   fp16/bf16 pair instructions: common/fpconv.h's integer conversions,
 *   the same code as a CPU rank's, and the fp32 path, which rounds to the
 *   same bits (kernel.cu, "fp16 and bf16 sums and products").
 * - 16-byte single-copy atomic stores for LL lines: each 8-byte half
 *   {data32, flag32} is an atomic of its own and its flag is checked on
 *   its own, as the emulation does.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_KERNEL_PORT_CUH
#define LOOM_KERNEL_PORT_CUH

#if defined(LOOM_CUDA_EMU)
#define PORT_EMU 1
#elif defined(__HIPCC__)
#define PORT_HIP 1
#else
#define PORT_CUDA 1
#endif

#if PORT_HIP
#include <hip/hip_runtime.h>
#include "common/fpconv.h"
#ifndef LOOM_HIP
#define LOOM_HIP 1 /* HIP's compiler: gpurt.h maps to HIP's runtime */
#endif
#include "misc/gpurt.h" /* kernel.cu's launch functions call the runtime by CUDA's names */
#elif PORT_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#endif /* the emulation's come with its shim */
#include <stdint.h>

/* ---- small float formats --------------------------------------------------- */

#if PORT_HIP
__device__ __forceinline__ float port_half_in(uint16_t v) { return fpconv_half_to_float(v); }
__device__ __forceinline__ uint16_t port_half_out(float f) { return fpconv_float_to_half(f); }
__device__ __forceinline__ float port_bf16_in(uint16_t v) { return fpconv_bf16_to_float(v); }
__device__ __forceinline__ uint16_t port_bf16_out(float f) { return fpconv_float_to_bf16(f); }
__device__ __forceinline__ float port_e4m3_in(uint8_t v) { return fpconv_e4m3_to_float(v); }
__device__ __forceinline__ uint8_t port_e4m3_out(float f) { return fpconv_float_to_e4m3(f); }
__device__ __forceinline__ float port_e5m2_in(uint8_t v) { return fpconv_e5m2_to_float(v); }
__device__ __forceinline__ uint8_t port_e5m2_out(float f) { return fpconv_float_to_e5m2(f); }
#define PORT_PAIRS 0
#else
__device__ __forceinline__ float port_half_in(uint16_t v) { return __half2float(__ushort_as_half(v)); }
__device__ __forceinline__ uint16_t port_half_out(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float port_bf16_in(uint16_t v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
__device__ __forceinline__ uint16_t port_bf16_out(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float port_e4m3_in(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3)));
}
__device__ __forceinline__ uint8_t port_e4m3_out(float f) { return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3); }
__device__ __forceinline__ float port_e5m2_in(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E5M2)));
}
__device__ __forceinline__ uint8_t port_e5m2_out(float f) { return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2); }
/* __half2 and __nv_bfloat162 with __hadd2_rn / __hmul2_rn. */
#define PORT_PAIRS 1
#endif

/* ---- data: 16-byte packs ------------------------------------------------------ */

/* Every pointer the kernel moves data through is global memory (device,
 * or mapped host memory): said so, NVIDIA's loads and stores skip the
 * generic address check. They are volatile to the compiler, so that the
 * loads of a pack group are issued together and none moves across a
 * barrier; clang keeps plain accesses on AMD within __syncthreads too. */
#if PORT_CUDA
__device__ __forceinline__ uint4 ld_pack(const uint4 *p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(__cvta_generic_to_global(p))
               : "memory");
  return v;
}
__device__ __forceinline__ void st_pack(uint4 *p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(p)), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
#else
__device__ __forceinline__ uint4 ld_pack(const uint4 *p) { return *p; }
__device__ __forceinline__ void st_pack(uint4 *p, uint4 v) { *p = v; }
#endif

/* ---- FIFO counters and the status words ----------------------------------- */

#if PORT_EMU
__device__ __forceinline__ uint64_t load_acquire(const uint64_t *p) { return emu_load_acquire(p); }
__device__ __forceinline__ void store_release(uint64_t *p, uint64_t v) { emu_store_release(p, v); }
/* The status words the host's proxy thread shares with the kernel. */
template <typename T> __device__ __forceinline__ T status_load(const volatile T *p) { return emu_volatile_load(p); }
template <typename T> __device__ __forceinline__ void status_store(volatile T *p, T v) { emu_volatile_store(p, v); }
template <typename T> __device__ __forceinline__ void status_publish(volatile T *p, T v) { emu_volatile_publish(p, v); }
#else
template <typename T> __device__ __forceinline__ T status_load(const volatile T *p) { return *p; }
template <typename T> __device__ __forceinline__ void status_store(volatile T *p, T v) { *p = v; }
/* What this thread wrote before is visible to the host before v is. */
template <typename T> __device__ __forceinline__ void status_publish(volatile T *p, T v) {
  __threadfence_system();
  *p = v;
}
#if PORT_HIP
__device__ __forceinline__ uint64_t load_acquire(const uint64_t *p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ void store_release(uint64_t *p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
#else
__device__ __forceinline__ uint64_t load_acquire(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
#endif
#endif

/* What a block writes into the proxy's progress word: a time, which no
 * later write repeats (a count of slots would start again with every
 * launch, and a run of small calls would look like a kernel stuck). The
 * host only compares it with what it read before, so its unit is free. */
#if PORT_EMU
__device__ __forceinline__ uint64_t progress_stamp() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#elif PORT_HIP
__device__ __forceinline__ uint64_t progress_stamp() {
#if defined(__HIP_DEVICE_COMPILE__)
  return (uint64_t)__builtin_amdgcn_s_memrealtime(); /* 100 MHz on gfx90a and gfx942 */
#else
  return 0; /* the host pass of a device function: never run */
#endif
}
#else
__device__ __forceinline__ uint64_t progress_stamp() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

/* The kernel's parameters, by value in the parameter space and
 * addressable there (sm_70 on); on AMD kernel arguments are addressable
 * as they are. */
#if PORT_EMU
#define KERNEL_PARAMS const struct dev_params &params
#elif PORT_HIP
#define KERNEL_PARAMS const struct dev_params params
#else
#define KERNEL_PARAMS const __grid_constant__ struct dev_params params
#endif

/* ---- barriers of the warp-specialised Simple loop (kernel_simple.cuh) ----- */

enum { BAR_READY = 1, BAR_DONE = 2, BAR_SYNC_WARP = 3 };

#if PORT_EMU
#define PORT_NAMED_BARRIERS 1
__device__ __forceinline__ void bar_sync(unsigned id, unsigned n) { emu_bar_sync(id, n); }
__device__ __forceinline__ void bar_arrive(unsigned id, unsigned n) { emu_bar_arrive(id, n); }
/* The sync warp's lanes wait for its lane 0 (a 1-thread "warp" has none). */
__device__ __forceinline__ void sync_warp_sync(unsigned sw) {
  if (sw > 1)
    emu_bar_sync(BAR_SYNC_WARP, sw);
}
/* Thread 0 polling while the data threads work: here they run only when
 * it gives way. */
__device__ __forceinline__ void poll_pause() { emu_yield(); }
__device__ __forceinline__ void hint_bump(uint32_t *p) { __atomic_fetch_add(p, 1u, __ATOMIC_RELAXED); }
__device__ __forceinline__ uint32_t hint_load(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
/* Threads of thread 0's group: a warp, as on a GPU, from 64 threads; one
 * thread below, so that the 7- and 32-thread runs take this loop too. */
__device__ __forceinline__ uint32_t sync_width(uint32_t nthr) { return nthr >= 64 ? 32 : 1; }
#elif PORT_CUDA
#define PORT_NAMED_BARRIERS 1
/* bar.sync / bar.arrive are warp-aligned: the warp reconverges first. */
__device__ __forceinline__ void bar_sync(unsigned id, unsigned n) {
  __syncwarp();
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(unsigned id, unsigned n) {
  __syncwarp();
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void sync_warp_sync(unsigned) { __syncwarp(); }
__device__ __forceinline__ uint32_t sync_width(uint32_t) { return 32; }
#else
/* No named barriers: the serial loop, whose every thread meets at
 * __syncthreads, is the only one (these are never reached). */
#define PORT_NAMED_BARRIERS 0
__device__ __forceinline__ void bar_sync(unsigned, unsigned) { __builtin_trap(); }
__device__ __forceinline__ void bar_arrive(unsigned, unsigned) { __builtin_trap(); }
__device__ __forceinline__ void sync_warp_sync(unsigned) { __builtin_trap(); }
__device__ __forceinline__ uint32_t sync_width(uint32_t) { return 64; /* a wavefront */ }
#endif
#if !PORT_EMU
/* Thread 0 polls while the data warps run beside it. */
__device__ __forceinline__ void poll_pause() {}
__device__ __forceinline__ void hint_bump(uint32_t *p) { atomicAdd(p, 1u); }
__device__ __forceinline__ uint32_t hint_load(const uint32_t *p) { return *(const volatile uint32_t *)p; }
#endif

/* ---- LL lines (kernel_ll.cuh) ------------------------------------------------ */

#if PORT_CUDA
/* One 16-byte volatile load: both halves and their flags as they were at
 * one moment (a 16-byte aligned access is single-copy atomic). */
__device__ __forceinline__ bool ll_read(const char *line, uint32_t flag, uint64_t *v) {
  uint32_t d0, f0, d1, f1;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
               : "l"(__cvta_generic_to_global(line))
               : "memory");
  *v = (uint64_t)d0 | (uint64_t)d1 << 32;
  return f0 == flag && f1 == flag;
}
__device__ __forceinline__ void ll_write(char *line, uint64_t v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(__cvta_generic_to_global(line)),
               "r"((uint32_t)v), "r"(flag), "r"((uint32_t)(v >> 32)), "r"(flag)
               : "memory");
}
#elif PORT_HIP
/* Each 8-byte half {data32, flag32} single-copy atomic on its own: a half
 * whose flag is this use's carries this use's data, whatever the other
 * half shows. */
__device__ __forceinline__ bool ll_read(const char *line, uint32_t flag, uint64_t *v) {
  const uint64_t *q = (const uint64_t *)line;
  uint64_t lo = __hip_atomic_load(q, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  uint64_t hi = __hip_atomic_load(q + 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  *v = (lo & 0xffffffffull) | hi << 32;
  return (uint32_t)(lo >> 32) == flag && (uint32_t)(hi >> 32) == flag;
}
__device__ __forceinline__ void ll_write(char *line, uint64_t v, uint32_t flag) {
  uint64_t *q = (uint64_t *)line;
  __hip_atomic_store(q, (v & 0xffffffffull) | (uint64_t)flag << 32, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  __hip_atomic_store(q + 1, (v >> 32) | (uint64_t)flag << 32, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
#else
__device__ __forceinline__ bool ll_read(const char *line, uint32_t flag, uint64_t *v) {
  return emu_ll_load(line, flag, v);
}
__device__ __forceinline__ void ll_write(char *line, uint64_t v, uint32_t flag) { emu_ll_store(line, v, flag); }
#endif

#endif
