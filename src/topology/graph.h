/*
 * The machine as a graph, as NCCL sees it: CPUs (one per NUMA node), the
 * PCI tree under them (bridges and switches), GPUs with their NVLinks,
 * NVSwitches, and NICs. Links carry a kind and a bandwidth; paths between
 * any two nodes get NCCL's classification (NVL, NVB, PIX, PXB, PHB, SYS)
 * and the bandwidth of their narrowest link.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TOPO_GRAPH_H
#define LOOM_TOPO_GRAPH_H

#include <stdint.h>

#include "nccl.h"
#include "common/path_type.h"

enum topo_type { TOPO_GPU = 0, TOPO_PCI = 1, TOPO_NVS = 2, TOPO_CPU = 3, TOPO_NIC = 4, TOPO_NTYPES = 5 };

enum link_type {
  LINK_LOC = 0, /* a node to itself */
  LINK_NVL = 1, /* NVLink (to a GPU or an NVSwitch) */
  LINK_PCI = 2, /* PCIe, between a device and its parent */
  LINK_SYS = 3, /* between CPUs: the inter-socket interconnect */
};

const char *topo_type_name(int type);

#define TOPO_MAX_LINKS 64
#define TOPO_MAX_NODES 512

#define TOPO_BUSID_LEN 16
#define TOPO_MAX_PCI_DEPTH 16 /* bridges between a device and its CPU */

struct topo_link {
  int type;  /* enum link_type */
  int peer;  /* node index */
  double bw; /* GB/s in this direction */
};

struct topo_node {
  int type;        /* enum topo_type */
  int parent;      /* PCI tree: the node above (a bridge or the CPU); -1 for CPUs */
  char busid[TOPO_BUSID_LEN]; /* PCI devices: "0000:19:00.0" (lowercase) */
  int numa;        /* the NUMA node of the CPU it hangs under */
  /* GPU */
  int dev;         /* CUDA/NVML ordinal at discovery, -1 if unknown */
  int sm;          /* compute capability x 10 */
  /* NIC */
  char name[32];   /* interface or IB device name */
  int speed_mbps;
  int port;
  /* CPU */
  char affinity[128]; /* cpulist, "0-27,56-83" */
  int ncores;
  char arch[16], vendor[32];
  /* PCI */
  char link_speed[32]; /* as sysfs says it, "32.0 GT/s PCIe" */
  int link_width;
  int pci_class;       /* 0x060400 bridge, 0x030200 3D controller, ... */
  int nlinks;
  struct topo_link links[TOPO_MAX_LINKS];
};

struct topo_path {
  uint8_t type; /* enum path_type */
  uint8_t hops;
  float bw;     /* GB/s, the narrowest link */
};

struct topo_system {
  int n, cap;
  struct topo_node *nodes;
  struct topo_path *paths; /* n x n, after topo_compute_paths */
  char host[64];
};

ncclResult_t topo_system_new(struct topo_system **out);
void topo_system_free(struct topo_system *s);

/* Adds a node (fields zeroed, parent -1, dev -1); returns its index. */
ncclResult_t topo_add_node(struct topo_system *s, int type, int *index);
/* Links a to b both ways with the same kind and bandwidth. */
ncclResult_t topo_connect(struct topo_system *s, int a, int b, int type, double bw);
int topo_find_busid(const struct topo_system *s, const char *busid);
int topo_count(const struct topo_system *s, int type);
/* The index of the i-th node of a type (in the order they were added). */
int topo_nth(const struct topo_system *s, int type, int i);

/* Bandwidths, NCCL's model: PCIe per generation and width, NVLink per
 * link and architecture, the inter-socket link per CPU vendor. */
double topo_pci_bw(const char *link_speed, int width);
double topo_nvlink_bw(int sm);
double topo_sys_bw(const char *vendor);

/* Links every CPU to every other (LINK_SYS), then computes all paths. */
ncclResult_t topo_compute_paths(struct topo_system *s);
static inline const struct topo_path *topo_path(const struct topo_system *s, int a, int b) {
  return &s->paths[a * s->n + b];
}

/* The nearest CPU (by path) of a node. */
int topo_local_cpu(const struct topo_system *s, int node);

#endif
