/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "comm.h"
#include "topology/topo.h"
#include "misc/utils.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if LOOM_HAVE_HWLOC
#include <hwloc.h>
#endif
#if LOOM_HAVE_NUMA
#include <numa.h>
#endif

static int read_line(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  int ok = fgets(buf, (int)len, f) != NULL;
  fclose(f);
  return ok;
}

uint64_t topo_host_hash(void) {
  if (param_is_set(P_HOSTID))
    return util_hash_str(param_str(P_HOSTID), 0x686f7374);
  char boot[128] = "", netns[128] = "";
  if (!read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot))
    gethostname(boot, sizeof boot - 1);
  ssize_t n = readlink("/proc/self/ns/net", netns, sizeof netns - 1);
  if (n > 0)
    netns[n] = '\0';
  uint64_t h = util_hash_str(boot, 0x686f7374);
  return util_hash_str(netns, h);
}

ncclResult_t topo_build_rings(struct ncclComm *comm) {
  int n = comm->nranks;
  int *order;
  CHECK(UTIL_CALLOC(&order, n, "ring order"));
  int k = 0;
  /* Host by host, in the order their first rank appears. */
  for (int r = 0; r < n; r++) {
    int seen = 0;
    for (int q = 0; q < r; q++)
      if (comm->peers[q].host_hash == comm->peers[r].host_hash)
        seen = 1;
    if (seen)
      continue;
    for (int q = r; q < n; q++)
      if (comm->peers[q].host_hash == comm->peers[r].host_hash)
        order[k++] = q;
  }
  for (int c = 0; c < comm->nchannels; c++) {
    struct channel *ch = &comm->channels[c];
    ch->id = c;
    ch->ring = order; /* shared by all channels until topology search gives each its own */
    for (int i = 0; i < n; i++)
      if (order[i] == comm->rank)
        ch->ring_index = i;
    ch->ring_next = order[(ch->ring_index + 1) % n];
    ch->ring_prev = order[(ch->ring_index - 1 + n) % n];
  }
  if (log_enabled(LOG_INFO, LOG_GRAPH)) {
    char line[512];
    size_t o = 0;
    for (int i = 0; i < n && o < sizeof line - 16; i++)
      o += snprintf(line + o, sizeof line - o, "%s%d", i ? " " : "", order[i]);
    INFO(LOG_GRAPH, "ring: %s (%d channel%s)", line, comm->nchannels, comm->nchannels > 1 ? "s" : "");
  }
  return ncclSuccess;
}

static pthread_once_t host_logged = PTHREAD_ONCE_INIT;

static void log_host_once(void) {
  int cores = -1, numa = -1;
#if LOOM_HAVE_HWLOC
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) == 0) {
    if (hwloc_topology_load(t) == 0) {
      cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
      numa = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    }
    hwloc_topology_destroy(t);
  }
#endif
#if LOOM_HAVE_NUMA
  if (numa < 0 && numa_available() >= 0)
    numa = numa_num_configured_nodes();
#endif
  if (cores < 0)
    cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (numa < 0) {
    /* sysfs lists one nodeN directory per NUMA node; a kernel without
     * NUMA has one node. */
    numa = 0;
    char path[64];
    for (int i = 0; i < 1024; i++) {
      snprintf(path, sizeof path, "/sys/devices/system/node/node%d", i);
      if (access(path, F_OK) == 0)
        numa++;
    }
    if (numa == 0)
      numa = 1;
  }
  INFO(LOG_INIT, "host: %d cores, %d NUMA node%s (%s)", cores, numa, numa == 1 ? "" : "s",
       LOOM_HAVE_HWLOC ? "hwloc" : LOOM_HAVE_NUMA ? "libnuma" : "sysfs");
}

void topo_log_host(void) {
  if (log_enabled(LOG_INFO, LOG_INIT))
    pthread_once(&host_logged, log_host_once);
}
