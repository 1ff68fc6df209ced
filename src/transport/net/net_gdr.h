/*
 * GPUDirect RDMA for the net transport: whether a CUDA communicator's
 * connection lets the NIC write (receive) or read (send) device memory
 * directly, decided as NCCL decides it, and the device memory such a
 * connection registers with the plugin.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_NET_GDR_H
#define LOOM_NET_GDR_H

#include <stddef.h>

#include "nccl.h"

struct conn;
struct net_plugin;

/* How the plugin reaches device memory: as a dma-buf the CUDA driver
 * exports (reg_mr_dmabuf), or by the pointer itself (reg_mr with
 * NET_PTR_CUDA: nvidia-peermem for IB). */
enum gdr_mode { GDR_OFF = 0, GDR_DMABUF = 1, GDR_PEERMEM = 2 };

/* NCCL_NET_GDR_LEVEL's value as a path type (topology/graph.h): LOC, PIX,
 * PXB, PHB, SYS in any case, or NCCL's legacy numbers (0 LOC, 1 PIX, 2
 * PXB, 3 PHB, 4 and above SYS). The error names the variable and value. */
ncclResult_t gdr_parse_level(const char *value, int *level);
/* The level in force: NCCL_NET_GDR_LEVEL, or NCCL's default PXB. */
ncclResult_t gdr_env_level(int *level);

/* Everything the decision depends on, gathered by gdr_choose; a plain
 * structure so that the decision itself is a pure function the unit
 * tests drive. */
struct gdr_query {
  const char *plugin;    /* the plugin's name */
  const char *nic;       /* the plugin device's name */
  int ptr_support;       /* NET_PTR_* of that device */
  int has_reg_dmabuf;    /* the plugin has reg_mr_dmabuf */
  int gpu;               /* CUDA ordinal */
  int gpu_gdr;           /* cudaDevAttrGPUDirectRDMASupported */
  int cuda_dmabuf;       /* the driver exports the GPU's memory as dma-buf */
  const char *no_dmabuf; /* why not, when not */
  int distance;          /* GPU-NIC path type, -1 where the topology has no path */
  int level;             /* gdr_env_level */
  int level_set;         /* NCCL_NET_GDR_LEVEL was given */
  int read;              /* the send side: the NIC would read device memory */
  int read_param;        /* NCCL_NET_GDR_READ: -1 (NCCL's default), 0 or 1 */
  int sm;                /* compute capability x 10 */
  int nvlink;            /* an NVLink to another GPU, or the host's only GPU */
  int force_flush;       /* the plugin or NCCL_NET_FORCE_FLUSH asks for flushes */
};

struct gdr_choice {
  int mode;       /* enum gdr_mode */
  int flush;      /* receive side with GDR: flush each receive before kernels read it */
  char why[512];  /* the decision and its reason, as logged */
};

void gdr_decide(const struct gdr_query *q, struct gdr_choice *c);

/* Whether nvidia-peermem (or the older nv_peer_mem) is loaded, the files
 * NCCL looks for; `root` prefixes the paths ("" on a real system). */
int gdr_peermem_loaded(const char *root);

/* The decision for connection `c` over device `dev` of plugin `p`:
 * topology, driver, plugin and environment gathered, decided, and logged
 * once per GPU, NIC and direction (INFO, NET). A host communicator gets
 * GDR_OFF without a word. */
ncclResult_t gdr_choose(struct conn *c, const struct net_plugin *p, int dev, struct gdr_choice *out);

/* Device memory a GDR connection registers: host-page aligned, as
 * dma-buf export requires. */
struct gdr_mem {
  void *alloc;
  char *base;
  size_t size;
  size_t alloc_size; /* what was allocated for it (size and a page) */
};

ncclResult_t gdr_mem_alloc(size_t size, struct gdr_mem *m);
/* Registers the whole of `m` with the plugin on `comm`, the way `mode` says. */
ncclResult_t gdr_mem_register(const struct net_plugin *p, void *comm, int mode, const struct gdr_mem *m,
                              void **mhandle);
void gdr_mem_free(struct gdr_mem *m);

#endif
