/* Placement: memory on a NUMA node, threads on a set of CPUs.
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef LOOM_PLACE_H
#define LOOM_PLACE_H

#include <stddef.h>
#include <stdint.h>

/* Asks the kernel to put the pages of [ptr, ptr+size) on NUMA node `node`
 * (before they are touched). A no-op without libnuma or on one node. */
void place_memory(void *ptr, size_t size, int node);

/* Binds the calling thread to the CPUs of `cpulist` ("0-27,56-83"): within
 * the process's current affinity, unless ignore_affinity (the caller's
 * NCCL_IGNORE_CPU_AFFINITY, read where reading the environment is safe).
 * Does nothing when the list is empty or the intersection is. Returns 1
 * if it bound the thread. */
int place_thread(const char *cpulist, int ignore_affinity);

/* The CPUs a rank may run on (its affinity), as ranks tell each other at
 * init: CPUs 0-1023, glibc's cpu_set_t. */
#define PLACE_CPU_WORDS 16
struct place_cpus {
  uint64_t w[PLACE_CPU_WORDS];
};

/* The calling thread's affinity; every CPU where the kernel will not say
 * (a machine of more than 1024), which counts such a rank as uncrowded. */
void place_cpus_self(struct place_cpus *c);

/* Whether rank `who` of one host's ranks, whose CPU sets are set[0..n),
 * is crowded: more of them may run on its CPUs (their sets meet its own)
 * than those ranks' CPUs number. Ranks the launcher pinned one per CPU
 * are not, however few CPUs each has; eight ranks free to run on two
 * CPUs, or pinned four to each, are. */
int place_crowded(const struct place_cpus *const *set, int n, int who);

/* How many CPUs the set holds. */
int place_cpu_count(const struct place_cpus *c);

#endif
