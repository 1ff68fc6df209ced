/* Placement: memory on a NUMA node, threads on a set of CPUs.
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef LOOM_PLACE_H
#define LOOM_PLACE_H

#include <stddef.h>

/* Asks the kernel to put the pages of [ptr, ptr+size) on NUMA node `node`
 * (before they are touched). A no-op without libnuma or on one node. */
void place_memory(void *ptr, size_t size, int node);

/* Binds the calling thread to the CPUs of `cpulist` ("0-27,56-83"): within
 * the process's current affinity, unless ignore_affinity (the caller's
 * NCCL_IGNORE_CPU_AFFINITY, read where reading the environment is safe).
 * Does nothing when the list is empty or the intersection is. Returns 1
 * if it bound the thread. */
int place_thread(const char *cpulist, int ignore_affinity);

#endif
