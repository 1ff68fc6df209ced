/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "misc/place.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#if LOOM_HAVE_NUMA
#include <numa.h>
#endif

void place_memory(void *ptr, size_t size, int node) {
#if LOOM_HAVE_NUMA
  if (node >= 0 && numa_available() >= 0 && numa_max_node() > 0)
    numa_tonode_memory(ptr, size, node);
#else
  (void)ptr;
  (void)size;
  (void)node;
#endif
}

static int parse_cpulist(const char *list, cpu_set_t *set) {
  CPU_ZERO(set);
  const char *p = list;
  int n = 0;
  while (p && *p) {
    char *end;
    long a = strtol(p, &end, 10), b = a;
    if (end == p)
      return n;
    if (*end == '-')
      b = strtol(end + 1, &end, 10);
    for (long c = a; c <= b && c < CPU_SETSIZE; c++, n++)
      CPU_SET((int)c, set);
    p = *end == ',' ? end + 1 : NULL;
  }
  return n;
}

int place_thread(const char *cpulist, int ignore_affinity) {
  cpu_set_t want, have;
  if (!cpulist || !cpulist[0] || parse_cpulist(cpulist, &want) == 0)
    return 0;
  if (!ignore_affinity && sched_getaffinity(0, sizeof have, &have) == 0)
    CPU_AND(&want, &want, &have);
  if (CPU_COUNT(&want) == 0)
    return 0;
  if (pthread_setaffinity_np(pthread_self(), sizeof want, &want) != 0)
    return 0;
  INFO(LOG_INIT, "thread bound to CPUs %s%s", cpulist,
       ignore_affinity ? " (NCCL_IGNORE_CPU_AFFINITY)" : " within the job's affinity");
  return 1;
}

void place_cpus_self(struct place_cpus *c) {
  cpu_set_t set;
  memset(c, 0, sizeof *c);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    memset(c, 0xff, sizeof *c);
    return;
  }
  for (int cpu = 0; cpu < CPU_SETSIZE && cpu < 64 * PLACE_CPU_WORDS; cpu++)
    if (CPU_ISSET(cpu, &set))
      c->w[cpu / 64] |= (uint64_t)1 << (cpu % 64);
}

int place_cpu_count(const struct place_cpus *c) {
  int n = 0;
  for (int i = 0; i < PLACE_CPU_WORDS; i++)
    n += __builtin_popcountll(c->w[i]);
  return n;
}

int place_crowded(const struct place_cpus *const *set, int n, int who) {
  struct place_cpus all;
  memset(&all, 0, sizeof all);
  int sharing = 0;
  for (int q = 0; q < n; q++) {
    uint64_t meet = 0;
    for (int i = 0; i < PLACE_CPU_WORDS; i++)
      meet |= set[q]->w[i] & set[who]->w[i];
    if (!meet)
      continue;
    sharing++;
    for (int i = 0; i < PLACE_CPU_WORDS; i++)
      all.w[i] |= set[q]->w[i];
  }
  return sharing > place_cpu_count(&all);
}
