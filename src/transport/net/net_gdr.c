/*
 * GPUDirect RDMA decisions (net_gdr.h), as NCCL's ncclTopoCheckGdr makes
 * them: the plugin must take device memory (NET_PTR_CUDA or
 * NET_PTR_DMABUF), the GPU must allow it, the driver must offer a way
 * (dma-buf export, or a plugin that reaches device memory itself through
 * nvidia-peermem), sends only where NCCL_NET_GDR_READ allows, and only as
 * far from the GPU as NCCL_NET_GDR_LEVEL says (default PXB). Receives into
 * device memory are flushed before a kernel reads them on GPUs before
 * Hopper, as NCCL does (NCCL_NET_FORCE_FLUSH on all).
 * SPDX-License-Identifier: Apache-2.0
 */
#include "core.h"
#include "comm/comm.h"
#include "common/path_type.h"
#include "misc/cudamem.h"
#include "transport/net/net.h"
#include "transport/net/net_gdr.h"
#include "transport/transport.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

ncclResult_t gdr_parse_level(const char *v, int *level) { return path_parse_level("NCCL_NET_GDR_LEVEL", v, 0, level); }

ncclResult_t gdr_env_level(int *level) {
  *level = PATH_PXB;
  return param_is_set(P_NET_GDR_LEVEL) ? gdr_parse_level(param_str(P_NET_GDR_LEVEL), level) : ncclSuccess;
}

/* Appends to the choice's sentence. */
__attribute__((format(printf, 2, 3))) static void say(struct gdr_choice *c, const char *fmt, ...) {
  size_t o = strlen(c->why);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why + o, sizeof c->why - o, fmt, ap);
  va_end(ap);
}

static void off(const struct gdr_query *q, struct gdr_choice *c) {
  c->mode = GDR_OFF;
  c->flush = 0;
  say(c, "GDR%s off for GPU %d / %s: ", q->read ? " read" : "", q->gpu, q->nic);
}

void gdr_decide(const struct gdr_query *q, struct gdr_choice *c) {
  memset(c, 0, sizeof *c);
  const char *staged = q->read ? "sends stage through host memory" : "receives land in host memory";
  if (!(q->ptr_support & (NET_PTR_CUDA | NET_PTR_DMABUF))) {
    off(q, c);
    say(c, "plugin %s takes host memory only; %s", q->plugin, staged);
    return;
  }
  if (!q->gpu_gdr) {
    off(q, c);
    say(c, "the GPU does not support GPUDirect RDMA (cudaDevAttrGPUDirectRDMASupported is 0); %s", staged);
    return;
  }
  if (q->read && q->read_param == 0) {
    off(q, c);
    say(c, "NCCL_NET_GDR_READ=0; %s", staged);
    return;
  }
  if (q->read && q->read_param < 0 && q->sm < 80 && !q->nvlink) {
    off(q, c);
    say(c, "as in NCCL, GPUs before compute capability 8.0 (this one is %d.%d) without NVLink read through host "
        "memory unless NCCL_NET_GDR_READ=1; %s", q->sm / 10, q->sm % 10, staged);
    return;
  }
  /* A NIC the topology does not place (a topology file without it, a
   * plugin device without a PCI path) is taken as far as it can be. */
  int dist = q->distance >= 0 ? q->distance : PATH_SYS;
  char dtext[128], ltext[64];
  if (q->distance >= 0)
    snprintf(dtext, sizeof dtext, "%s", path_type_name(dist));
  else
    snprintf(dtext, sizeof dtext, "SYS, since the topology has no path to %s", q->nic);
  snprintf(ltext, sizeof ltext, "%s%s", path_type_name(q->level),
           q->level_set ? "" : " (NCCL_NET_GDR_LEVEL's default)");
  if (q->level == PATH_LOC || dist > q->level) {
    off(q, c);
    say(c, "the distance %s is beyond NCCL_NET_GDR_LEVEL %s; %s", dtext, ltext, staged);
    return;
  }
  if ((q->ptr_support & NET_PTR_DMABUF) && q->has_reg_dmabuf && q->cuda_dmabuf) {
    c->mode = GDR_DMABUF;
  } else if (q->ptr_support & NET_PTR_CUDA) {
    c->mode = GDR_PEERMEM;
  } else {
    off(q, c);
    if (!q->has_reg_dmabuf)
      say(c, "plugin %s takes device memory only as dma-buf but has no dma-buf registration; %s", q->plugin, staged);
    else
      say(c, "plugin %s takes device memory only as dma-buf, and %s; %s", q->plugin,
          q->no_dmabuf ? q->no_dmabuf : "the driver exports none", staged);
    return;
  }
  say(c, "GDR%s on for GPU %d / %s (%s, %s <= %s): ", q->read ? " read" : "", q->gpu, q->nic,
      c->mode == GDR_DMABUF ? "dma-buf" : "peermem", dtext, ltext);
  if (q->read) {
    say(c, "sends read device memory");
    return;
  }
  c->flush = q->force_flush || q->sm < 90;
  say(c, "receives land in device memory, %s", c->flush ? "each flushed before kernels read it" : "no flush needed");
  if (q->force_flush)
    say(c, " (NCCL_NET_FORCE_FLUSH or the plugin asks for it)");
  else
    say(c, " (compute capability %d.%d %s 9.0)", q->sm / 10, q->sm % 10, c->flush ? "<" : ">=");
}

int gdr_peermem_loaded(const char *root) {
  static const char *const files[] = {"/sys/kernel/mm/memory_peers/nv_mem/version",
                                      "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
                                      "/sys/module/nvidia_peermem/version"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", root, files[i]);
    if (access(path, F_OK) == 0)
      return 1;
  }
  return 0;
}

/* Each decision is logged once per process: every channel and peer of a
 * GPU and NIC decides the same. */
static void log_once(const char *plugin, const struct gdr_choice *c) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static char seen[32][sizeof c->why];
  static int nseen;
  pthread_mutex_lock(&lock);
  int found = 0;
  for (int i = 0; i < nseen && !found; i++)
    found = strcmp(seen[i], c->why) == 0;
  if (!found && nseen < 32)
    snprintf(seen[nseen++], sizeof seen[0], "%s", c->why);
  pthread_mutex_unlock(&lock);
  if (!found)
    INFO(LOG_NET | LOG_INIT, "NET/%s: %s", plugin, c->why);
}

ncclResult_t gdr_choose(struct conn *c, const struct net_plugin *p, int dev, struct gdr_choice *out) {
  memset(out, 0, sizeof *out);
  if (c->comm->is_host)
    return ncclSuccess;
  struct net_props pr;
  CHECK(p->get_properties(dev, &pr));
  char no_dmabuf[256] = "";
  struct gdr_query q = {
      .plugin = p->name,
      .nic = pr.name,
      .ptr_support = pr.ptr_support,
      .has_reg_dmabuf = p->reg_mr_dmabuf != net_no_reg_mr_dmabuf,
      .gpu = c->comm->cuda_dev,
      .level_set = param_is_set(P_NET_GDR_LEVEL),
      .read = c->dir == CONN_SEND,
      .read_param = (int)param_int(P_NET_GDR_READ),
      .force_flush = pr.force_flush || param_int(P_NET_FORCE_FLUSH),
      .no_dmabuf = no_dmabuf,
  };
  CHECK(gdr_env_level(&q.level));
  /* The driver is asked only where the plugin could use the answer. */
  if (pr.ptr_support & (NET_PTR_CUDA | NET_PTR_DMABUF)) {
    q.gpu_gdr = cuda_gdr_supported(q.gpu);
    q.sm = cuda_compute_capability(q.gpu);
    q.cuda_dmabuf = (pr.ptr_support & NET_PTR_DMABUF) && cuda_dmabuf_supported(q.gpu, no_dmabuf, sizeof no_dmabuf);
    q.distance = -1;
    q.nvlink = cuda_device_count() <= 1;
    if (c->comm->gpu_nic_facts)
      c->comm->gpu_nic_facts(q.gpu, pr.pci_path, pr.name, pr.port, &q.distance, &q.nvlink);
  }
  gdr_decide(&q, out);
  log_once(p->name, out);
  return ncclSuccess;
}

ncclResult_t gdr_mem_alloc(size_t size, struct gdr_mem *m) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  memset(m, 0, sizeof *m);
  m->size = (size + page - 1) & ~(page - 1);
  /* One page more than needed, so that a page-aligned range of the full
   * size fits whatever alignment cudaMalloc gives. */
  CHECK(cuda_malloc(&m->alloc, m->size + page, "a network FIFO in device memory (GPUDirect RDMA)"));
  m->alloc_size = m->size + page;
  m->base = (char *)(((uintptr_t)m->alloc + page - 1) & ~(uintptr_t)(page - 1));
  return ncclSuccess;
}

ncclResult_t gdr_mem_register(const struct net_plugin *p, void *comm, int mode, const struct gdr_mem *m,
                              void **mhandle) {
  if (mode == GDR_PEERMEM)
    return p->reg_mr(comm, m->base, m->size, NET_PTR_CUDA, mhandle);
  int fd = -1;
  CHECK(cuda_dmabuf_fd(m->base, m->size, &fd));
  /* The registration holds its own reference to the dma-buf. */
  ncclResult_t r = p->reg_mr_dmabuf(comm, m->base, m->size, NET_PTR_CUDA, 0, fd, mhandle);
  close(fd);
  return r;
}

void gdr_mem_free(struct gdr_mem *m) {
  cuda_free(m->alloc);
  memset(m, 0, sizeof *m);
}
