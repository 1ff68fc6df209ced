/*
 * Between the parts of the CUDA emulation (docs/emulation.md): the kernel
 * shim (cuda_emu.h), the grid runner (emu_grid.cpp) and the runtime
 * (emu_runtime.cpp, the CUDA runtime API on the CPU).
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_EMU_H
#define LOOM_EMU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*emu_kernel_fn)(const void *arg);

/* Runs a grid to its end on the calling thread's behalf: at most
 * `resident` blocks at once, each an OS thread whose `threads` CUDA
 * threads are fibers run in a seeded order. */
void emu_run_grid(unsigned blocks, unsigned threads, unsigned resident, emu_kernel_fn kernel, const void *arg,
                  uint64_t seed);

/* kernel<<<blocks, threads, 0, stream>>>(arg) in stream order; the CUDA
 * error code. The runtime chooses the threads per block
 * (LOOM_EMU_THREADS) and the blocks resident at once. */
int emu_launch(void *stream, unsigned blocks, emu_kernel_fn kernel, const void *arg);

/* The blocks of the kernel that can be resident at once on the current
 * device (LOOM_EMU_RESIDENT), as cudaOccupancy* would say on a GPU. */
unsigned emu_resident_blocks(void);

#ifdef __cplusplus
}
#endif

#endif
