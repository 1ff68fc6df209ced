/*
 * Between the parts of the CUDA emulation (docs/emulation.md): the kernel
 * shim (cuda_emu.h), the grid runner (emu_grid.cpp) and the runtime
 * (emu_runtime.cpp, emu_graph.cpp: the CUDA runtime API on the CPU).
 * Plain C, so that a test written in C can launch a kernel of its own.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_EMU_H
#define LOOM_EMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*emu_kernel_fn)(const void *arg);

struct emu_dim {
  unsigned x, y, z;
};

/* The running CUDA thread: threadIdx, blockIdx, blockDim, gridDim. */
struct emu_thread {
  struct emu_dim tid, bid, bdim, gdim;
};

/* The calling CUDA thread's (null outside a kernel). cuda_emu.h reads
 * the same through emu_self. */
const struct emu_thread *emu_current(void);

/* Runs a grid to its end on the calling thread's behalf: at most
 * `resident` blocks at once, each an OS thread whose `threads` CUDA
 * threads are fibers run in a seeded order. */
void emu_run_grid(unsigned blocks, unsigned threads, unsigned resident, emu_kernel_fn kernel, const void *arg,
                  uint64_t seed);

/* kernel<<<blocks, threads, 0, stream>>>(arg) in stream order; the CUDA
 * error code. The runtime chooses the threads per block
 * (LOOM_EMU_THREADS) and the blocks resident at once. `arg` is passed as
 * it is: what it points to is read when the kernel runs. */
int emu_launch(void *stream, unsigned blocks, emu_kernel_fn kernel, const void *arg);

/* The same with the kernel's parameters by value, as CUDA passes them:
 * the `bytes` bytes at `params` are copied when this is called (or, on a
 * stream being captured, into the graph, so every replay sees them as
 * they were at capture), and the kernel gets a pointer to the copy
 * (aligned to 64 bytes), valid until its grid ends. More than 32764 bytes
 * (a GPU's limit since CUDA 12.1) is cudaErrorInvalidValue. */
int emu_launch_params(void *stream, unsigned blocks, emu_kernel_fn kernel, const void *params, size_t bytes);

/* The blocks of the kernel that can be resident at once on the current
 * device (LOOM_EMU_RESIDENT), as cudaOccupancy* would say on a GPU. */
unsigned emu_resident_blocks(void);

/* Named barriers, for kernels whose warps do different work (PTX
 * bar.sync / bar.arrive). `id` 0 is __syncthreads' barrier, 1 to 15 are
 * named. `count` is the number of CUDA threads (fibers) that complete the
 * barrier, 1 to blockDim.x: the kernel computes it from blockDim.x as it
 * would on a GPU, where it must be a multiple of 32 (the emulation, whose
 * blocks may have 1 to 1024 threads, takes any count). A barrier completes
 * when `count` arrivals (of either kind) have been counted; all arrivals
 * of one completion must give the same count. emu_bar_sync counts the
 * caller and waits for the completion (what every arrival did before
 * happens before what it does after); emu_bar_arrive counts it and goes
 * on. A misuse (a count out of range or differing, a barrier that can no
 * longer complete, every thread of the block waiting) prints a line and
 * aborts, as a GPU would hang. */
void emu_bar_sync(unsigned id, unsigned count);
void emu_bar_arrive(unsigned id, unsigned count);

/* Lets the other CUDA threads of the block run: a thread that spins on a
 * flag another thread of its block sets must call it in the loop (on a
 * GPU the other warps run beside it; here they run only when it gives
 * way). No memory ordering: the flag is an atomic. */
void emu_yield(void);

#ifdef __cplusplus
}
#endif

#endif
