/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "comm/comm.h"
#include "bootstrap/bootstrap.h"
#include "topology/discover.h"
#include "topology/search.h"
#include "topology/topo.h"
#include "topology/topo_xml.h"
#include "misc/cudamem.h"
#include "misc/utils.h"

#include <pthread.h>
#include <sched.h>
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

/* ---- the process's topology ---- */

static pthread_once_t system_once = PTHREAD_ONCE_INIT;
static struct topo_system *system_topo;
static ncclResult_t system_status;
static char system_error[LOOM_ERR_LEN];

static void system_load(void) {
  if (param_is_set(P_TOPO_FILE)) {
    system_status = topo_load(param_str(P_TOPO_FILE), &system_topo);
    if (system_status == ncclSuccess)
      INFO(LOG_GRAPH | LOG_INIT, "topology loaded from NCCL_TOPO_FILE=%s", param_str(P_TOPO_FILE));
  } else {
    system_status = topo_discover(&system_topo);
  }
  if (system_status == ncclSuccess && param_is_set(P_TOPO_DUMP_FILE)) {
    system_status = topo_dump(system_topo, param_str(P_TOPO_DUMP_FILE));
    if (system_status == ncclSuccess)
      INFO(LOG_GRAPH | LOG_INIT, "topology written to NCCL_TOPO_DUMP_FILE=%s", param_str(P_TOPO_DUMP_FILE));
  }
  if (system_status != ncclSuccess)
    snprintf(system_error, sizeof system_error, "%s", err_thread_last());
}

ncclResult_t topo_get_system(const struct topo_system **out) {
  pthread_once(&system_once, system_load);
  if (system_status != ncclSuccess)
    return err_set(system_status, "%s", system_error);
  *out = system_topo;
  return ncclSuccess;
}

void topo_rank_channels(int gpu, const char *busid, int lanes, struct topo_channel_rule *out) {
  if (!gpu) {
    topo_channel_rule(NULL, 0, -1, lanes, out); /* 1, whatever the host has */
    return;
  }
  pthread_once(&system_once, system_load);
  if (system_status != ncclSuccess) {
    memset(out, 0, sizeof *out);
    out->gpu = gpu;
    out->alone = out->shared = 1;
    return;
  }
  int node = busid && busid[0] ? topo_find_busid(system_topo, busid) : -1;
  topo_channel_rule(system_topo, gpu, node, lanes, out);
}

int topo_bound_channels(int n, int min_ctas, int max_ctas) {
  int want = (int)LOOM_MAX(param_int(P_MIN_NCHANNELS), LOOM_MIN(param_int(P_MAX_NCHANNELS), n));
  if (min_ctas != NCCL_CONFIG_UNDEF_INT && min_ctas > want)
    want = LOOM_MIN(min_ctas, LOOM_MAX_CHANNELS);
  if (max_ctas != NCCL_CONFIG_UNDEF_INT && max_ctas > 0 && max_ctas < want)
    want = max_ctas;
  return want;
}

int topo_current_numa(void) {
  int cpu = sched_getcpu();
  if (cpu < 0)
    return 0;
#if LOOM_HAVE_NUMA
  /* libnuma fills its per-node CPU mask cache (numa_node_to_cpus, which
   * numa_node_of_cpu calls) on first use without a lock: communicators
   * initialised on several threads at once (a group, ncclCommInitAll)
   * would race there and lose the cache's allocations. */
  static pthread_mutex_t numa_lock = PTHREAD_MUTEX_INITIALIZER;
  if (numa_available() >= 0) {
    pthread_mutex_lock(&numa_lock);
    int node = numa_node_of_cpu(cpu);
    pthread_mutex_unlock(&numa_lock);
    return node < 0 ? 0 : node;
  }
#endif
  for (int node = 0; node < 4096; node++) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/node%d", cpu, node);
    if (access(path, F_OK) == 0)
      return node;
  }
  return 0;
}

/* The topology node a rank runs on: its GPU, or the CPU of its NUMA node. */
static int rank_device(const struct topo_system *t, const struct peer_info *p) {
  if (p->busid[0]) {
    int g = topo_find_busid(t, p->busid);
    if (g >= 0)
      return g;
  }
  int first = -1;
  for (int i = 0; i < t->n; i++)
    if (t->nodes[i].type == TOPO_CPU) {
      if (t->nodes[i].numa == p->numa)
        return i;
      if (first < 0)
        first = i;
    }
  return first;
}

static void log_channels(const struct ncclComm *comm) {
  if (!log_enabled(LOG_INFO, LOG_GRAPH))
    return;
  for (int c = 0; c < comm->nchannels; c++) {
    const struct channel *ch = &comm->channels[c];
    char line[512];
    size_t o = 0;
    for (int i = 0; i < comm->nranks && o < sizeof line - 16; i++)
      o += snprintf(line + o, sizeof line - o, "%s%d", i ? " " : "", ch->ring[i]);
    char nic[64] = "";
    if (ch->nic_name[0])
      snprintf(nic, sizeof nic, "; NIC %s port %d", ch->nic_name, ch->nic_port);
    INFO(LOG_GRAPH, "channel %02d: ring %s; tree up %d down %d/%d/%d%s", c, line, ch->tree_up, ch->tree_down[0],
         ch->tree_down[1], ch->tree_down[2], nic);
  }
}

/* The channel's NIC as plugins name it, for the net transport. */
static void channel_nic_name(struct channel *ch) {
  const struct topo_system *t = NULL;
  ch->nic_name[0] = '\0';
  ch->nic_port = 0;
  if (ch->nic < 0 || topo_get_system(&t) != ncclSuccess || ch->nic >= t->n)
    return;
  snprintf(ch->nic_name, sizeof ch->nic_name, "%s", t->nodes[ch->nic].name);
  ch->nic_port = t->nodes[ch->nic].port;
}

ncclResult_t topo_setup_channels(struct ncclComm *comm) {
  const struct topo_system *t = NULL;
  CHECK(topo_get_system(&t));
  int n = comm->nranks, me = comm->rank;
  /* Hosts in the order of their lowest rank; the ranks of each. */
  int *host_of, *nlocal, **host_ranks;
  CHECK(UTIL_CALLOC(&host_of, n, "hosts"));
  CHECK(UTIL_CALLOC(&nlocal, n, "hosts"));
  CHECK(UTIL_CALLOC(&host_ranks, n, "hosts"));
  int nhosts = 0;
  for (int r = 0; r < n; r++) {
    int h = -1;
    for (int q = 0; q < r && h < 0; q++)
      if (comm->peers[q].host_hash == comm->peers[r].host_hash)
        h = host_of[q];
    if (h < 0)
      h = nhosts++;
    host_of[r] = h;
    nlocal[h]++;
  }
  ncclResult_t res = ncclSuccess;
  for (int h = 0; h < nhosts && res == ncclSuccess; h++)
    res = UTIL_CALLOC(&host_ranks[h], nlocal[h], "a host's ranks");
  struct host_plan *plans = NULL;
  /* What every rank tells the others: its place in its host's chains and
   * the bandwidths the tuner needs, so that all tune alike. */
  struct rank_topo {
    uint8_t pos[LOOM_MAX_CHANNELS];
    float chain_gbs, nic_gbs;
  } *pos = NULL;
  int mine = host_of[me], nch = comm->nchannels;
  if (res == ncclSuccess)
    res = UTIL_CALLOC(&plans, nhosts, "host plans");
  if (res == ncclSuccess)
    res = UTIL_CALLOC(&pos, (size_t)n, "chain positions");
  if (res != ncclSuccess)
    goto out;
  for (int h = 0; h < nhosts; h++)
    nlocal[h] = 0;
  for (int r = 0; r < n; r++)
    host_ranks[host_of[r]][nlocal[host_of[r]]++] = r;
  /* This rank plans its own host from its own topology; the other hosts'
   * chains arrive as each rank's position in them. */
  int *dev;
  CHECK_GOTO(UTIL_CALLOC(&dev, nlocal[mine], "devices"), res, out);
  for (int i = 0; i < nlocal[mine]; i++)
    dev[i] = rank_device(t, &comm->peers[host_ranks[mine][i]]);
  if (!comm->is_host) {
    /* Threads that serve a GPU run on the CPUs next to it. */
    int gpu = rank_device(t, &comm->peers[me]);
    int cpu = gpu >= 0 ? topo_local_cpu(t, gpu) : -1;
    if (cpu >= 0)
      snprintf(comm->local_cpus, sizeof comm->local_cpus, "%s", t->nodes[cpu].affinity);
  }
  res = topo_plan_host(t, nlocal[mine], dev, nch, nhosts > 1, &plans[mine]);
  if (res == ncclSuccess) {
    double chain, nic;
    topo_plan_bw(t, &plans[mine], dev, nhosts > 1, &chain, &nic);
    pos[me].chain_gbs = (float)chain;
    pos[me].nic_gbs = (float)nic;
  }
  free(dev);
  if (res != ncclSuccess)
    goto out;
  for (int c = 0; c < nch; c++)
    for (int k = 0; k < nlocal[mine]; k++)
      if (host_ranks[mine][plans[mine].chain[c * nlocal[mine] + k]] == me)
        pos[me].pos[c] = (uint8_t)k;
  CHECK_GOTO(bootstrap_allgather(comm->boot, pos, sizeof *pos), res, out);
  comm->topo_chain_gbs = comm->topo_nic_gbs = 0;
  for (int r = 0; r < n; r++) {
    if (pos[r].chain_gbs > 0 && (comm->topo_chain_gbs == 0 || pos[r].chain_gbs < comm->topo_chain_gbs))
      comm->topo_chain_gbs = pos[r].chain_gbs;
    if (pos[r].nic_gbs > 0 && (comm->topo_nic_gbs == 0 || pos[r].nic_gbs < comm->topo_nic_gbs))
      comm->topo_nic_gbs = pos[r].nic_gbs;
  }
  for (int h = 0; h < nhosts; h++) {
    if (h == mine)
      continue;
    plans[h].n = nlocal[h];
    plans[h].nchannels = nch;
    CHECK_GOTO(UTIL_CALLOC(&plans[h].chain, (size_t)nlocal[h] * nch, "a host's chains"), res, out);
    for (int c = 0; c < nch; c++)
      for (int i = 0; i < nlocal[h]; i++) {
        int k = pos[host_ranks[h][i]].pos[c];
        if (k >= nlocal[h]) {
          res = err_set(ncclInternalError, "rank %d reported position %d in a chain of %d", host_ranks[h][i], k,
                        nlocal[h]);
          goto out;
        }
        plans[h].chain[c * nlocal[h] + k] = i;
      }
  }
  struct channels chs;
  CHECK_GOTO(topo_build_channels(nhosts, plans, host_ranks, n, &chs), res, out);
  comm->topo_rings = chs.ring;
  chs.ring = NULL;
  for (int c = 0; c < nch; c++) {
    struct channel *ch = &comm->channels[c];
    ch->id = c;
    ch->ring = comm->topo_rings + (size_t)c * n;
    for (int i = 0; i < n; i++)
      if (ch->ring[i] == me)
        ch->ring_index = i;
    ch->ring_next = ch->ring[(ch->ring_index + 1) % n];
    ch->ring_prev = ch->ring[(ch->ring_index - 1 + n) % n];
    ch->tree_up = chs.tree_up[c * n + me];
    for (int k = 0; k < 3; k++)
      ch->tree_down[k] = chs.tree_down[(c * n + me) * TREE_MAX_CHILDREN + k];
    ch->nic = plans[mine].nic[c];
    channel_nic_name(ch);
  }
  topo_channels_free(&chs);
  log_channels(comm);
out:
  for (int h = 0; h < nhosts; h++) {
    free(host_ranks[h]);
    if (plans)
      topo_plan_free(&plans[h]);
  }
  free(plans);
  free(pos);
  free(host_of);
  free(nlocal);
  free(host_ranks);
  return res;
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

/* The topology node of a plugin's device: by the PCI address its sysfs
 * path ends in, else by name and port. */
static int nic_node(const struct topo_system *t, const char *pci_path, const char *name, int port) {
  const char *slash = strrchr(pci_path, '/');
  if (slash && slash[1]) {
    int i = topo_find_busid(t, slash + 1);
    if (i >= 0 && t->nodes[i].type == TOPO_NIC)
      return i;
  }
  for (int i = 0; i < t->n; i++)
    if (t->nodes[i].type == TOPO_NIC && strcmp(t->nodes[i].name, name) == 0 &&
        (t->nodes[i].port <= 0 || t->nodes[i].port == port))
      return i;
  return -1;
}

int topo_gpu_path(const char *busid_a, const char *busid_b) {
  const struct topo_system *t = NULL;
  if (!busid_a[0] || !busid_b[0] || topo_get_system(&t) != ncclSuccess)
    return -1;
  int a = topo_find_busid(t, busid_a), b = topo_find_busid(t, busid_b);
  if (a < 0 || b < 0 || t->nodes[a].type != TOPO_GPU || t->nodes[b].type != TOPO_GPU)
    return -1;
  return topo_path(t, a, b)->type;
}

int topo_p2p_default_level(void) {
  const struct topo_system *t = NULL;
  if (topo_get_system(&t) != ncclSuccess)
    return PATH_SYS;
  for (int i = 0; i < t->n; i++) {
    const struct topo_node *c = &t->nodes[i];
    if (c->type == TOPO_CPU &&
        (strstr(c->vendor, "Intel") || strncmp(c->arch, "aarch64", 7) == 0 || strncmp(c->arch, "arm", 3) == 0))
      return PATH_PXB;
  }
  return PATH_SYS;
}

void topo_gpu_nic_facts(int gpu, const char *nic_pci_path, const char *nic_name, int nic_port, int *distance,
                        int *nvlink) {
  const struct topo_system *t = NULL;
  char busid[CUDA_BUSID_BYTES];
  if (topo_get_system(&t) != ncclSuccess || cuda_bus_id(gpu, busid) != ncclSuccess)
    return;
  int g = topo_find_busid(t, busid), n = nic_node(t, nic_pci_path, nic_name, nic_port);
  if (g < 0 || t->nodes[g].type != TOPO_GPU)
    return;
  *nvlink = topo_count(t, TOPO_GPU) <= 1;
  for (int i = 0; i < t->n; i++)
    if (i != g && t->nodes[i].type == TOPO_GPU && topo_path(t, g, i)->type <= PATH_NVB)
      *nvlink = 1;
  if (n >= 0 && topo_path(t, g, n)->type != PATH_DIS)
    *distance = topo_path(t, g, n)->type;
}
