/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "misc/place.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
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
