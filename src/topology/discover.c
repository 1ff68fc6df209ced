/*
 * Discovering this host: CPUs, NUMA nodes and the PCI bridges above
 * every device through hwloc (with its I/O objects), GPUs and their
 * NVLinks through NVML (the PCI class in sysfs where NVML cannot be
 * loaded), NICs from /sys/class/infiniband and the socket plugin's
 * interfaces. Without hwloc, or for a device hwloc does not show, the
 * sysfs path gives the bridges (/sys/devices/pci0000:00/0000:00:01.0/
 * 0000:01:00.0 lists them from the root down). Link speeds and widths
 * are read from sysfs either way, as hwloc itself does.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "misc/socket.h"
#include "topology/discover.h"
#include "topology/graph.h"
#include "topology/nvml.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>
#if LOOM_HAVE_HWLOC
#include <hwloc.h>
#endif

static int read_file(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  size_t n = fread(buf, 1, len - 1, f);
  fclose(f);
  buf[n] = '\0';
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
    buf[--n] = '\0';
  return 1;
}

static int pci_attr_int(const char *busid, const char *attr, int base, int def) {
  char path[256], buf[64];
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/%s", busid, attr);
  if (!read_file(path, buf, sizeof buf))
    return def;
  char *end;
  long v = strtol(buf, &end, base);
  return end == buf ? def : (int)v;
}

static int is_busid(const char *s) {
  unsigned a, b, c, d;
  char extra;
  return strlen(s) == 12 && sscanf(s, "%x:%x:%x.%x%c", &a, &b, &c, &d, &extra) == 4;
}

static int cpu_of_numa(const struct topo_system *s, int numa) {
  int first = -1;
  for (int i = 0; i < s->n; i++)
    if (s->nodes[i].type == TOPO_CPU) {
      if (s->nodes[i].numa == numa)
        return i;
      if (first < 0)
        first = i;
    }
  return first;
}

static int count_cpulist(const char *list) {
  int n = 0;
  const char *p = list;
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10), b = a;
    if (end == p)
      break;
    if (*end == '-')
      b = strtol(end + 1, &end, 10);
    n += (int)(b - a + 1);
    p = *end == ',' ? end + 1 : end;
    if (*end != ',')
      break;
  }
  return n;
}

static void cpu_identity(char *arch, size_t alen, char *vendor, size_t vlen) {
  struct utsname u;
  snprintf(arch, alen, "%.15s", uname(&u) == 0 ? u.machine : "");
  vendor[0] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f)) {
    if (strncmp(line, "vendor_id", 9) == 0) {
      char *c = strchr(line, ':');
      if (c) {
        snprintf(vendor, vlen, "%s", c + 2);
        vendor[strcspn(vendor, "\n")] = '\0';
      }
      break;
    }
  }
  if (f)
    fclose(f);
}

static ncclResult_t add_cpu(struct topo_system *s, int numa, const char *affinity, int ncores) {
  int idx;
  CHECK(topo_add_node(s, TOPO_CPU, &idx));
  struct topo_node *n = &s->nodes[idx];
  n->numa = numa;
  snprintf(n->affinity, sizeof n->affinity, "%s", affinity);
  n->ncores = ncores;
  cpu_identity(n->arch, sizeof n->arch, n->vendor, sizeof n->vendor);
  return ncclSuccess;
}

#if LOOM_HAVE_HWLOC
/* The machine as hwloc sees it, PCI bridges and devices included, for the
 * length of one topo_discover (NULL where it could not be loaded). */
static hwloc_topology_t hw;

static void hw_load(void) {
  if (hwloc_topology_init(&hw) != 0) {
    hw = NULL;
    return;
  }
  hwloc_topology_set_io_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_load(hw) != 0) {
    hwloc_topology_destroy(hw);
    hw = NULL;
  }
}

static void hw_unload(void) {
  if (hw)
    hwloc_topology_destroy(hw);
  hw = NULL;
}
#endif

static int discover_pci_chain(const char *busid, char chain[][TOPO_BUSID_LEN], int max, int *numa) {
#if LOOM_HAVE_HWLOC
  unsigned dom, bus, dev, fn;
  hwloc_obj_t o = NULL;
  if (hw && sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4)
    o = hwloc_get_pcidev_by_busid(hw, dom, bus, dev, fn);
  if (!o)
    return -1;
  /* Bridges from the device up; host bridges (the root complex) are the
   * CPU's and have no bus id of their own. */
  char up[TOPO_MAX_PCI_DEPTH][TOPO_BUSID_LEN];
  int n = 0;
  for (hwloc_obj_t p = o->parent; p && p->type == HWLOC_OBJ_BRIDGE && n < TOPO_MAX_PCI_DEPTH; p = p->parent) {
    if (p->attr->bridge.upstream_type != HWLOC_OBJ_BRIDGE_PCI)
      continue;
    const struct hwloc_pcidev_attr_s *a = &p->attr->bridge.upstream.pci;
    snprintf(up[n++], TOPO_BUSID_LEN, "%04x:%02x:%02x.%x", (unsigned)a->domain, (unsigned)a->bus,
             (unsigned)a->dev, (unsigned)a->func);
  }
  if (n > max)
    return -1;
  for (int i = 0; i < n; i++)
    memcpy(chain[i], up[n - 1 - i], TOPO_BUSID_LEN);
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(hw, o);
  *numa = anc && anc->nodeset && !hwloc_bitmap_iszero(anc->nodeset) ? hwloc_bitmap_first(anc->nodeset) : -1;
  return n;
#else
  (void)busid;
  (void)chain;
  (void)max;
  (void)numa;
  return -1;
#endif
}

int discover_pci_chain_probe(const char *busid, char chain[][TOPO_BUSID_LEN], int max, int *numa) {
#if LOOM_HAVE_HWLOC
  int mine = hw == NULL;
  if (mine)
    hw_load();
  int n = discover_pci_chain(busid, chain, max, numa);
  if (mine)
    hw_unload();
  return n;
#else
  return discover_pci_chain(busid, chain, max, numa);
#endif
}

static ncclResult_t discover_cpus(struct topo_system *s) {
#if LOOM_HAVE_HWLOC
  if (hw) {
    int nnuma = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nnuma; i++) {
      hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, i);
      char list[128] = "";
      hwloc_bitmap_list_snprintf(list, sizeof list, o->cpuset);
      int cores = hwloc_get_nbobjs_inside_cpuset_by_type(hw, o->cpuset, HWLOC_OBJ_CORE);
      CHECK(add_cpu(s, (int)o->os_index, list, cores));
    }
    if (nnuma > 0)
      return ncclSuccess;
  }
#endif
  for (int i = 0; i < 4096; i++) {
    char path[96], list[128];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", i);
    if (read_file(path, list, sizeof list))
      CHECK(add_cpu(s, i, list, count_cpulist(list)));
  }
  if (topo_count(s, TOPO_CPU) == 0) {
    char list[32];
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(list, sizeof list, "0-%ld", n > 0 ? n - 1 : 0);
    CHECK(add_cpu(s, 0, list, (int)(n > 0 ? n : 1)));
  }
  return ncclSuccess;
}

/* The node of `busid`, making the bridges above it on the way. */
static ncclResult_t insert_pci(struct topo_system *s, const char *busid, int type, int *out) {
  int have = topo_find_busid(s, busid);
  if (have >= 0) {
    *out = have;
    return ncclSuccess;
  }
  char chain[TOPO_MAX_PCI_DEPTH][TOPO_BUSID_LEN];
  int numa = -1, n = discover_pci_chain(busid, chain, TOPO_MAX_PCI_DEPTH, &numa);
  if (n < 0) {
    n = 0;
    numa = pci_attr_int(busid, "numa_node", 10, -1);
    char link[256], real[PATH_MAX];
    snprintf(link, sizeof link, "/sys/bus/pci/devices/%s", busid);
    if (realpath(link, real)) {
      char *save = NULL;
      for (char *c = strtok_r(real, "/", &save); c && n < TOPO_MAX_PCI_DEPTH; c = strtok_r(NULL, "/", &save))
        if (is_busid(c) && strcmp(c, busid) != 0)
          snprintf(chain[n++], TOPO_BUSID_LEN, "%s", c);
    }
  }
  int parent = cpu_of_numa(s, numa);
  for (int k = 0; k < n; k++) {
    const char *c = chain[k];
    int idx = topo_find_busid(s, c);
    if (idx < 0) {
      CHECK(topo_add_node(s, TOPO_PCI, &idx));
      struct topo_node *b = &s->nodes[idx];
      memcpy(b->busid, c, sizeof b->busid);
      b->busid[sizeof b->busid - 1] = '\0';
      b->parent = parent;
      b->numa = s->nodes[parent].numa;
      b->pci_class = pci_attr_int(c, "class", 16, -1);
      char p2[96];
      snprintf(p2, sizeof p2, "/sys/bus/pci/devices/%.15s/current_link_speed", c);
      read_file(p2, b->link_speed, sizeof b->link_speed);
      b->link_width = pci_attr_int(c, "current_link_width", 10, 0);
      CHECK(topo_connect(s, idx, parent, LINK_PCI, topo_pci_bw(b->link_speed, b->link_width)));
    }
    parent = idx;
  }
  int idx;
  CHECK(topo_add_node(s, type, &idx));
  struct topo_node *d = &s->nodes[idx];
  snprintf(d->busid, sizeof d->busid, "%s", busid);
  d->parent = parent;
  d->numa = s->nodes[parent].numa;
  d->pci_class = pci_attr_int(busid, "class", 16, -1);
  char p2[256];
  snprintf(p2, sizeof p2, "/sys/bus/pci/devices/%s/current_link_speed", busid);
  read_file(p2, d->link_speed, sizeof d->link_speed);
  d->link_width = pci_attr_int(busid, "current_link_width", 10, 0);
  CHECK(topo_connect(s, idx, parent, LINK_PCI, topo_pci_bw(d->link_speed, d->link_width)));
  *out = idx;
  return ncclSuccess;
}

static ncclResult_t discover_gpus(struct topo_system *s) {
  struct nvml_gpu g[64];
  int n = nvml_gpus(g, 64);
  if (n >= 0) {
    for (int i = 0; i < n; i++) {
      int idx;
      CHECK(insert_pci(s, g[i].busid, TOPO_GPU, &idx));
      s->nodes[idx].dev = i;
      s->nodes[idx].sm = g[i].sm;
    }
    int nvs = -1;
    for (int i = 0; i < n; i++) {
      int a = topo_find_busid(s, g[i].busid);
      for (int k = 0; k < g[i].nlinks; k++) {
        int b = topo_find_busid(s, g[i].link[k].target);
        double bw = g[i].link[k].count * topo_nvlink_bw(g[i].sm);
        if (b >= 0 && s->nodes[b].type == TOPO_GPU) {
          if (b > a)
            CHECK(topo_connect(s, a, b, LINK_NVL, bw));
          continue;
        }
        if (nvs < 0) {
          CHECK(topo_add_node(s, TOPO_NVS, &nvs));
          snprintf(s->nodes[nvs].busid, sizeof s->nodes[nvs].busid, "%s", g[i].link[k].target);
        }
        CHECK(topo_connect(s, a, nvs, LINK_NVL, bw));
      }
    }
    return ncclSuccess;
  }
  /* No NVML: NVIDIA display and 3D controllers from sysfs, without
   * NVLinks. */
  DIR *dir = opendir("/sys/bus/pci/devices");
  struct dirent *e;
  int dev = 0;
  while (dir && (e = readdir(dir))) {
    if (!is_busid(e->d_name) || pci_attr_int(e->d_name, "vendor", 16, 0) != 0x10de ||
        (pci_attr_int(e->d_name, "class", 16, 0) >> 16) != 0x03)
      continue;
    int idx;
    ncclResult_t r = insert_pci(s, e->d_name, TOPO_GPU, &idx);
    if (r != ncclSuccess) {
      closedir(dir);
      return r;
    }
    s->nodes[idx].dev = dev++;
  }
  if (dir)
    closedir(dir);
  return ncclSuccess;
}

/* The PCI function a network device sits on: the last busid in the path
 * its sysfs "device" link resolves to (virtio NICs hang one level below). */
static int net_busid(const char *sysdir, char *busid) {
  char link[512], real[PATH_MAX];
  snprintf(link, sizeof link, "%s/device", sysdir);
  if (!realpath(link, real))
    return 0;
  busid[0] = '\0';
  char *save = NULL;
  for (char *c = strtok_r(real, "/", &save); c; c = strtok_r(NULL, "/", &save))
    if (is_busid(c))
      snprintf(busid, 16, "%s", c);
  return busid[0] != '\0';
}

static ncclResult_t add_nic(struct topo_system *s, const char *busid, const char *name, int speed, int port) {
  int idx;
  if (busid && busid[0] && topo_find_busid(s, busid) >= 0)
    return ncclSuccess; /* an IB device and its netdev are one NIC */
  if (busid && busid[0]) {
    CHECK(insert_pci(s, busid, TOPO_NIC, &idx));
  } else {
    int cpu = cpu_of_numa(s, 0);
    CHECK(topo_add_node(s, TOPO_NIC, &idx));
    s->nodes[idx].parent = cpu;
    s->nodes[idx].numa = s->nodes[cpu].numa;
    CHECK(topo_connect(s, idx, cpu, LINK_PCI, speed / 8000.0));
  }
  struct topo_node *n = &s->nodes[idx];
  snprintf(n->name, sizeof n->name, "%s", name);
  n->speed_mbps = speed;
  n->port = port;
  /* The NIC's own link is no faster than its line rate. */
  for (int k = 0; k < n->nlinks; k++)
    n->links[k].bw = LOOM_MIN(n->links[k].bw, speed / 8000.0);
  int parent = n->parent;
  for (int k = 0; k < s->nodes[parent].nlinks; k++)
    if (s->nodes[parent].links[k].peer == idx)
      s->nodes[parent].links[k].bw = n->links[0].bw;
  return ncclSuccess;
}

static ncclResult_t discover_nics(struct topo_system *s) {
  DIR *dir = opendir("/sys/class/infiniband");
  struct dirent *e;
  while (dir && (e = readdir(dir))) {
    if (e->d_name[0] == '.')
      continue;
    char sysdir[300], busid[16] = "", path[400], rate[64];
    snprintf(sysdir, sizeof sysdir, "/sys/class/infiniband/%s", e->d_name);
    net_busid(sysdir, busid);
    for (int port = 1; port <= 8; port++) {
      snprintf(path, sizeof path, "%s/ports/%d/rate", sysdir, port);
      if (!read_file(path, rate, sizeof rate))
        break;
      ncclResult_t r = add_nic(s, busid, e->d_name, (int)(atof(rate) * 1000), port);
      if (r != ncclSuccess) {
        closedir(dir);
        return r;
      }
      busid[0] = '\0'; /* later ports share the function */
    }
  }
  if (dir)
    closedir(dir);
  /* The interfaces the socket plugin would use. */
  struct sock_iface ifs[SOCK_MAX_IFACES];
  int n = 0;
  if (sock_find_interfaces(ifs, SOCK_MAX_IFACES, &n) != ncclSuccess)
    n = 0; /* an NCCL_SOCKET_IFNAME that matches nothing is reported where sockets are used */
  for (int i = 0; i < n; i++) {
    char sysdir[300], speedfile[320], busid[16] = "", buf[32];
    snprintf(sysdir, sizeof sysdir, "/sys/class/net/%.16s", ifs[i].name);
    net_busid(sysdir, busid);
    snprintf(speedfile, sizeof speedfile, "%s/speed", sysdir);
    int speed = read_file(speedfile, buf, sizeof buf) ? atoi(buf) : 0;
    CHECK(add_nic(s, busid, ifs[i].name, speed > 0 ? speed : 10000, 1));
  }
  return ncclSuccess;
}

ncclResult_t topo_discover(struct topo_system **out) {
  struct topo_system *s;
  CHECK(topo_system_new(&s));
  gethostname(s->host, sizeof s->host - 1);
#if LOOM_HAVE_HWLOC
  hw_load();
#endif
  ncclResult_t r = discover_cpus(s);
  if (r == ncclSuccess)
    r = discover_gpus(s);
  if (r == ncclSuccess)
    r = discover_nics(s);
#if LOOM_HAVE_HWLOC
  hw_unload();
#endif
  if (r == ncclSuccess)
    r = topo_compute_paths(s);
  if (r != ncclSuccess) {
    topo_system_free(s);
    return r;
  }
  *out = s;
  return ncclSuccess;
}
