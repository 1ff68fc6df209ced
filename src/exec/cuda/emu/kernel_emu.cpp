/*
 * kernel.cu, the very source the GPU runs, compiled as host C++ through
 * the kernel shim: the emulated build's kernel (docs/emulation.md).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "exec/cuda/emu/cuda_emu.h"
#include "exec/cuda/emu/emu.h"

#include "exec/cuda/kernel.cu"
